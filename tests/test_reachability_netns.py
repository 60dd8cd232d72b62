"""A peer behind a real NAT (network namespaces made by this test) serves a client through a relay.

    wan  11.1.0.1/24 ── 11.1.0.2 [router: MASQUERADE] 192.168.77.1 ── 192.168.77.2/24  home
    (4 bootstrap DHT nodes = relays,                                           (the peer
     a direct peer serving 2:4, the client)                                     serving 0:2)

The wan side has no route into 192.168.77.0/24, so nobody can dial the home peer: its dial-back
check fails, it joins relayed (DHT client, circuit relay through the bootstrap node), says so
in one line, marks its record `relayed`, and the client's generation still passes through it.
The wan addresses are outside the private ranges because libp2p's autorelay ignores relays on
private addresses. Needs root, `ip` and `iptables` with kernel NAT; skipped (saying which) if not.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client.local_swarm import SwarmProcess

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (apt-get install iproute2 iptables)"
    return None


@pytest.fixture
def nat(tmp_path: Path) -> Iterator[dict[str, str]]:
    if why := netns_unavailable():
        pytest.skip(why)
    tag = secrets.token_hex(2)
    wan, router, home = f"lsw-wan-{tag}", f"lsw-nat-{tag}", f"lsw-home-{tag}"
    names = {"wan": wan, "router": router, "home": home}
    try:
        for ns in names.values():
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", f"w{tag}", "netns", wan, "type", "veth", "peer", "name", f"r{tag}", "netns", router)
        sh("ip", "link", "add", f"h{tag}", "netns", home, "type", "veth", "peer", "name", f"i{tag}", "netns", router)
        for ns, dev, addr in [(wan, f"w{tag}", "11.1.0.1/24"), (router, f"r{tag}", "11.1.0.2/24"),
                              (router, f"i{tag}", "192.168.77.1/24"), (home, f"h{tag}", "192.168.77.2/24")]:
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", home, "route", "add", "default", "via", "192.168.77.1")
        sh("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        try:
            sh("ip", "netns", "exec", router, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "192.168.77.0/24",
               "-o", f"r{tag}", "-j", "MASQUERADE")
        except subprocess.CalledProcessError as e:
            pytest.skip(f"iptables MASQUERADE failed here (kernel without NAT?): {e.stderr.strip()}")
        yield names
    finally:
        for ns in names.values():
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in out.stdout.split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def spawn(ns: str, args: list[str], log: Path, module: str = "peer.cli") -> SwarmProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", module, *args] if module else [sys.executable, *args]
    proc = subprocess.Popen(["ip", "netns", "exec", ns, *command], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=open(log, "w"), stdin=subprocess.DEVNULL, text=True,  # noqa: SIM115
                            start_new_session=True)
    process = SwarmProcess(proc, log)
    threading.Thread(target=process._pump, daemon=True).start()
    return process


# libp2p's autorelay reserves a relay slot at once when it knows 4 relay candidates (else only
# after its ~3 minute boot delay), so the home peer gets 4 relays; the client still retries
# until the relayed peer is reachable.
RELAYS = 4
CLIENT = textwrap.dedent(
    """
    import json, sys, time, torch
    from client import DistributedModel
    model = DistributedModel.from_pretrained(sys.argv[1], [sys.argv[2]])
    try:
        view = model.swarm.loop.run(model.swarm.view(fresh=True), timeout=60)
        print(json.dumps({r.peer_id: r.relayed for r in view.records.values()}), flush=True)
        ids, deadline, start = torch.tensor([json.loads(sys.argv[3])]), time.time() + 400, time.time()
        while True:
            try:
                out = model.generate(ids, max_new_tokens=8)
                break
            except Exception as e:
                if time.time() > deadline:
                    raise
                print(f"not yet ({time.time() - start:.0f} s): {e}", file=sys.stderr, flush=True)
                time.sleep(2)
        print(json.dumps({"tokens": out[0].tolist(), "seconds": time.time() - start}), flush=True)
    finally:
        model.close()
    """
)


@pytest.mark.timeout(900)  # the client's 400 s of retries if autorelay still waits out its boot delay
def test_peer_behind_nat_serves_through_a_relay(nat: dict[str, str], tiny_model: Path, tmp_path: Path) -> None:
    started: list[SwarmProcess] = []
    try:
        relays = [spawn(nat["wan"], ["dht", "--host-maddrs", f"/ip4/11.1.0.1/tcp/{31340 + i}"], tmp_path / f"dht{i}.log")
                  for i in range(RELAYS)]
        started += relays
        initial = relays[0].wait_for_line("/ip4/11.1.0.1/")
        direct = spawn(nat["wan"], ["serve", "--model", str(tiny_model), "--layers", "2:4", "--initial-peers", initial,
                                    "--host-maddrs", "/ip4/11.1.0.1/tcp/31331"], tmp_path / "direct.log")
        started.append(direct)
        more = [relay.wait_for_line("/ip4/11.1.0.1/") for relay in relays[1:]]
        home = spawn(nat["home"], ["serve", "--model", str(tiny_model), "--layers", "0:2", "--initial-peers", initial,
                                   *(a for m in more for a in ("--initial-peers", m)), "--port", "31337"],
                     tmp_path / "home.log")
        started.append(home)
        direct_id = direct.wait_for_line("online", 180).split()[1]
        home_id = home.wait_for_line("online", 180).split()[1]
        log = home.log_text()
        assert "other peers cannot connect to this machine" in log and "--public-ip" in log, log[-3000:]

        ids = torch.randint(3, 300, (12,), generator=torch.Generator().manual_seed(0)).tolist()
        client = spawn(nat["wan"], ["-c", CLIENT, str(tiny_model), initial, json.dumps(ids)], tmp_path / "client.log",
                       module="")  # `python -c`: the client is an ordinary user of DistributedModel
        started.append(client)
        relayed = json.loads(client.wait_for_line("{", 240))
        assert relayed == {home_id: True, direct_id: False}  # the record says so (the monitor shows it)
        result = json.loads(client.wait_for_line('{"tokens"', 600))
    finally:
        for process in reversed(started):
            process.kill()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    expected = reference.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert result["tokens"] == expected[0].tolist()
