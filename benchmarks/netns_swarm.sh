#!/usr/bin/env bash
# A private delayed network for swarm benchmarks: a hub namespace (DHT + client) and N peer
# namespaces, each joined to the hub by its own link with DELAY_MS one-way delay.
#
#   sudo benchmarks/netns_swarm.sh [N_PEERS] -- COMMAND...
#
# COMMAND runs inside the hub namespace with LSW_PEER_NS="lsw-p1 lsw-p2 ..." and
# LSW_PEER_ADDRS="10.213.1.2 ..." and LSW_HUB_ADDR in its environment; it starts peers with
# `ip netns exec lsw-pK ...`. Everything this script made is removed on exit (trap EXIT).
#
# Why not tc netem: this machine's kernel has no sch_netem (`tc qdisc add ... netem` answers
# "Specified qdisc kind is unknown"; no fq/etf either, and no kernel modules to load). So
# each link is two TAP devices, one in the hub and one in the peer's namespace, bridged by a
# small userspace delay line (below) that holds every Ethernet frame DELAY_MS before passing
# it on. Traffic still crosses a real link between namespaces; only the delay is userspace
# (its precision is measured and reported by the benchmark). Addresses: 10.213.K.0/24 per
# link, inside our namespaces only; nothing is routed to or from the root namespace.
set -euo pipefail

N_PEERS=${1:-3}
shift || true
[[ "${1:-}" == "--" ]] && shift
DELAY_MS=${DELAY_MS:-10}
PY=${PYTHON:-.venv/bin/python}
HUB=lsw-hub
PEERS=()
for k in $(seq 1 "$N_PEERS"); do PEERS+=("lsw-p$k"); done
DELAY_PID=""
STATE=$(mktemp -d /tmp/lsw-netns.XXXXXX)

cleanup() {
    set +e
    if [[ -n "$DELAY_PID" ]]; then kill "$DELAY_PID" 2>/dev/null; wait "$DELAY_PID" 2>/dev/null; fi
    # Deleting a namespace deletes the TAP devices inside it; kill what still runs in ours first.
    for ns in "${PEERS[@]}" "$HUB"; do
        if ip netns list | grep -qw "$ns"; then
            for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
            ip netns del "$ns"
        fi
    done
    for k in $(seq 1 "$N_PEERS"); do  # TAPs not yet moved (setup failed half-way)
        ip link del "lsw-h$k" 2>/dev/null; ip link del "lsw-q$k" 2>/dev/null
    done
    rm -rf "$STATE"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for ns in "$HUB" "${PEERS[@]}"; do
    if ip netns list | grep -qw "$ns"; then echo "namespace $ns exists (another run?); not touching it" >&2; exit 1; fi
done

# The delay line: makes 2*N TAP devices (lsw-hK, lsw-qK), forwards frames hK <-> qK after DELAY_MS.
cat > "$STATE/delay_line.py" <<'EOF'
import fcntl, heapq, os, selectors, struct, sys, time
TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000
delay, n = float(sys.argv[1]) / 1000.0, int(sys.argv[2])
def tap(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd
sel, peer_of = selectors.DefaultSelector(), {}
for k in range(1, n + 1):
    a, b = tap(f"lsw-h{k}"), tap(f"lsw-q{k}")
    peer_of[a], peer_of[b] = b, a
    sel.register(a, selectors.EVENT_READ); sel.register(b, selectors.EVENT_READ)
print("ready", flush=True)
queue, seq = [], 0  # (due, seq, out_fd, frame): FIFO per link since the delay is constant
while True:
    now = time.monotonic()
    while queue and queue[0][0] <= now:
        _, _, out, frame = heapq.heappop(queue)
        try: os.write(out, frame)
        except OSError: pass  # device down (namespace going away): the frame is lost
    timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else None
    for key, _ in sel.select(timeout):
        while True:
            try: frame = os.read(key.fd, 65536)
            except BlockingIOError: break
            except OSError: break
            seq += 1
            heapq.heappush(queue, (time.monotonic() + delay, seq, peer_of[key.fd], frame))
EOF

ip netns add "$HUB"
ip netns exec "$HUB" ip link set lo up
ip netns exec "$HUB" sysctl -qw net.ipv4.ip_forward=1  # the hub routes peer <-> peer (DHT traffic)
# Real-time priority keeps the delay precise while the peers load the CPUs.
chrt -f 20 "$PY" -u "$STATE/delay_line.py" "$DELAY_MS" "$N_PEERS" > "$STATE/delay.out" 2>&1 &
DELAY_PID=$!
for _ in $(seq 100); do grep -q ready "$STATE/delay.out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$STATE/delay.out" || { cat "$STATE/delay.out" >&2; exit 1; }

ADDRS=()
for k in $(seq 1 "$N_PEERS"); do
    ns=lsw-p$k
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
    ip link set "lsw-h$k" netns "$HUB"
    ip link set "lsw-q$k" netns "$ns"
    ip netns exec "$HUB" ip addr add "10.213.$k.1/24" dev "lsw-h$k"
    ip netns exec "$HUB" ip link set "lsw-h$k" up
    ip netns exec "$ns" ip addr add "10.213.$k.2/24" dev "lsw-q$k"
    ip netns exec "$ns" ip link set "lsw-q$k" up
    ip netns exec "$ns" ip route add default via "10.213.$k.1"
    ADDRS+=("10.213.$k.2")
done

export LSW_PEER_NS="${PEERS[*]}" LSW_PEER_ADDRS="${ADDRS[*]}" LSW_HUB_ADDR=10.213.1.1 LSW_DELAY_MS="$DELAY_MS"
set +e
ip netns exec "$HUB" "$@"
status=$?
exit $status
