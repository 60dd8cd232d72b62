"""Which addresses a peer listens on and announces, the join line, and the dial-back check.

A peer at home sits behind a router: it can dial out, but nobody can dial its private
address. `check_reachable` asks a member of the swarm to open a fresh connection to our
announced addresses; when that fails the peer runs relayed (DHT client mode, reachable
through a libp2p circuit relay) and says so in its record.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm.framing import read_frame, write_frame

logger = logging.getLogger(__name__)

LOOPBACK_LISTEN = "/ip4/127.0.0.1/tcp/0"
REACHABILITY_PROTOCOL = "layerswarm/reachability/v1"
MAX_DIAL_ADDRS = 8  # per request: a peer has a few interfaces, not dozens
MAX_REQUEST_BYTES = 4096
DIAL_TIMEOUT = 10.0  # seconds a member tries our addresses; a home uplink answers in well under 1 s
MAX_CONCURRENT_DIALS = 2  # a member dials back for at most this many askers at once


class AddressError(ValueError):
    """A multiaddr given on the command line is malformed; the message says what to pass instead."""


def parse_peer_maddr(text: str, option: str = "--initial-peers") -> str:
    """Check that `text` is a dialable multiaddr ending in /p2p/<peer id>; returns it unchanged."""
    try:
        maddr = Multiaddr(text)
    except Exception as e:  # the multiaddr library raises several unrelated types
        raise AddressError(
            f"{option} {text!r} is not a multiaddr ({e}); copy the join line a running peer prints, "
            "e.g. /ip4/203.0.113.5/tcp/31337/p2p/QmPeerId"
        ) from None
    names = [p.name for p in maddr.protocols()]
    if "p2p" not in names:
        raise AddressError(f"{option} {text!r} lacks the /p2p/<peer id> part; copy the whole join line a peer prints")
    if not {"tcp", "udp", "p2p-circuit"} & set(names):
        raise AddressError(f"{option} {text!r} names no port (/tcp/PORT); copy the whole join line a peer prints")
    return text


def parse_listen_maddr(text: str, option: str) -> str:
    try:
        Multiaddr(text)
    except Exception as e:
        raise AddressError(f"{option} {text!r} is not a multiaddr ({e}); e.g. /ip4/0.0.0.0/tcp/31337") from None
    return text


@dataclass(frozen=True)
class Addresses:
    """What the p2p daemon listens on (`host`) and tells others to dial (`announce`, None: its own guess)."""

    host: tuple[str, ...]
    announce: tuple[str, ...] | None


def plan_addresses(
    host_maddrs: Sequence[str] = (),
    announce_maddrs: Sequence[str] = (),
    public_ip: str | None = None,
    port: int | None = None,
) -> Addresses:
    """Combine --host-maddrs/--announce-maddrs with the --public-ip/--port shorthand.

    `--port P` listens on every interface at P (TCP and QUIC); `--public-ip X` announces X at
    that port, the address a router forwarding P reaches us on. Raises AddressError.
    """
    if port is not None and not 0 < port < 65536:
        raise AddressError(f"--port {port} is not a TCP port; choose 1..65535 (e.g. 31337)")
    if public_ip is not None:
        try:
            ip = ipaddress.ip_address(public_ip)
        except ValueError:
            raise AddressError(f"--public-ip {public_ip!r} is not an IP address; give the router's public IPv4 or IPv6") from None
        if port is None:
            raise AddressError("--public-ip needs --port: the port your router forwards to this machine")
    host = [parse_listen_maddr(m, "--host-maddrs") for m in host_maddrs]
    announce = [parse_listen_maddr(m, "--announce-maddrs") for m in announce_maddrs]
    if port is not None:
        host += [f"/ip4/0.0.0.0/tcp/{port}", f"/ip4/0.0.0.0/udp/{port}/quic"]
    if public_ip is not None:
        proto = "ip4" if ip.version == 4 else "ip6"
        announce += [f"/{proto}/{public_ip}/tcp/{port}", f"/{proto}/{public_ip}/udp/{port}/quic"]
    return Addresses(host=tuple(host or (LOOPBACK_LISTEN,)), announce=tuple(announce) or None)


def _ip_of(maddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    parts = maddr.split("/")
    if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
        try:
            return ipaddress.ip_address(parts[2])
        except ValueError:
            return None
    return None


def is_loopback(maddr: str) -> bool:
    ip = _ip_of(maddr)
    return ip is not None and ip.is_loopback


def machine_ips(maddrs: Iterable[str]) -> set[str]:
    """The IPs a peer announces, loopback and unspecified ones left out: two peers announcing one
    of these run on one machine (or behind one NAT). Peers on 127.0.0.1 tell nothing (a local swarm)."""
    ips = (_ip_of(m) for m in maddrs if not is_relayed(m))
    return {str(ip) for ip in ips if ip is not None and not ip.is_loopback and not ip.is_unspecified}


def machine_of(maddrs: Iterable[str]) -> str | None:
    """A name for the machine announcing `maddrs` (its lowest IP, see machine_ips), or None if unknown."""
    return min(machine_ips(maddrs), default=None)


def is_relayed(maddr: str) -> bool:
    return "/p2p-circuit" in maddr


def join_maddr(visible: Iterable[str]) -> str | None:
    """The address another machine should pass as --initial-peers: public, then private, then loopback.

    TCP before QUIC (every libp2p build dials TCP) and direct before relayed.
    """
    def rank(maddr: str) -> tuple[int, int]:
        ip = _ip_of(maddr)
        if is_relayed(maddr):
            where = 3
        elif ip is None or ip.is_loopback:
            where = 4
        elif ip.is_private or ip.is_link_local:
            where = 2 if ip.is_link_local else 1
        else:
            where = 0
        return where, 0 if "/tcp/" in maddr else 1

    candidates = [m for m in visible if "/p2p/" in m]
    return min(candidates, key=rank) if candidates else None


def join_advice(visible: Sequence[str]) -> str:
    """The log line telling the operator how others join, or why they cannot yet."""
    best = join_maddr(visible)
    if best is None:
        return "no address to share yet (the p2p daemon announced none)"
    line = f"others join with: --initial-peers {best}"
    if is_loopback(best):
        line += ("  (loopback only: this machine alone can use it; add --port 31337 to listen on every "
                 "interface, and --public-ip if a router forwards that port)")
    return line


# ---- dial-back: "can you reach me?" -----------------------------------------------------------


def _dial_addrs(visible: Iterable[str]) -> list[str]:
    """Our announced direct addresses without the /p2p/ suffix (relay circuits prove nothing)."""
    out = []
    for maddr in visible:
        if is_relayed(maddr):
            continue
        head = maddr.split("/p2p/")[0]
        if head and head not in out:
            out.append(head)
    return out[:MAX_DIAL_ADDRS]


def _parse_request(payload: bytes) -> tuple[PeerID, list[Multiaddr]]:
    """Validate an untrusted request {peer_id, addrs} (msgpack, never pickle)."""
    request = msgpack.unpackb(payload, raw=False)
    if not isinstance(request, dict):
        raise ValueError("request is not a map")
    peer_id, addrs = request.get("peer_id"), request.get("addrs")
    if not isinstance(peer_id, str) or not isinstance(addrs, list) or not 0 < len(addrs) <= MAX_DIAL_ADDRS:
        raise ValueError(f"need peer_id and 1..{MAX_DIAL_ADDRS} addrs")
    if not all(isinstance(a, str) and len(a) <= 256 and not is_relayed(a) for a in addrs):
        raise ValueError("addrs must be direct multiaddr strings")
    return PeerID.from_base58(peer_id), [Multiaddr(a) for a in addrs]


class DialBackService:
    """Answers other peers' reachability checks by dialing them from a separate probe daemon.

    A separate daemon, because our own already has a connection to the asker (the one the
    question came on) and would reuse it, proving nothing. The probe starts on the first request
    and dials only the addresses in the request, at most MAX_CONCURRENT_DIALS at a time.
    """

    def __init__(self) -> None:
        self._probe: P2P | None = None
        self._probe_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_DIALS)

    async def attach(self, p2p: P2P) -> None:
        await p2p.add_binary_stream_handler(REACHABILITY_PROTOCOL, self._handle)

    async def _handle(self, _info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                peer_id, addrs = _parse_request(await asyncio.wait_for(read_frame(reader, MAX_REQUEST_BYTES), 10))
            except Exception as e:
                await write_frame(writer, msgpack.packb({"ok": False, "error": f"bad request: {e}"[:200]}))
                return
            ok, error = await self._dial(peer_id, addrs)
            await write_frame(writer, msgpack.packb({"ok": ok, "error": error}))
        except Exception as e:  # the asker left; nothing to answer
            logger.debug("reachability request failed: %s", e)
        finally:
            writer.close()

    async def _dial(self, peer_id: PeerID, addrs: list[Multiaddr]) -> tuple[bool, str]:
        async with self._slots:
            probe = await self._get_probe()
            try:
                await asyncio.wait_for(probe._client.connect(peer_id, addrs), DIAL_TIMEOUT)
                return True, ""
            except Exception as e:
                return False, (str(e) or type(e).__name__)[:200]
            finally:
                with contextlib.suppress(Exception):
                    await probe._client.disconnect(peer_id)

    async def _get_probe(self) -> P2P:
        async with self._probe_lock:
            if self._probe is None:
                # No relays, no listening worth announcing: it only dials, directly.
                self._probe = await P2P.create(host_maddrs=[LOOPBACK_LISTEN], use_relay=False, auto_nat=False,
                                               nat_port_map=False, dht_mode="client")
            return self._probe

    async def close(self) -> None:
        if self._probe is not None:
            await self._probe.shutdown()
            self._probe = None


async def ask_dial_back(p2p: P2P, members: Sequence[str], timeout: float = DIAL_TIMEOUT + 10) -> bool | None:
    """Ask up to three members (their multiaddrs) to dial `p2p`'s announced addresses.

    True: some member reached us; False: members answered and none did; None: no member could
    be asked (old versions, all gone), so nothing is known.
    """
    addrs = _dial_addrs(str(m) for m in await p2p.get_visible_maddrs(latest=True))
    if not addrs:
        return False
    answered = False
    ids = list(dict.fromkeys(m.split("/p2p/")[-1] for m in members if "/p2p/" in m))
    for member in ids[:3]:
        try:
            _, reader, writer = await asyncio.wait_for(
                p2p.call_binary_stream_handler(PeerID.from_base58(member), REACHABILITY_PROTOCOL), timeout)
            try:
                await write_frame(writer, msgpack.packb({"peer_id": p2p.peer_id.to_base58(), "addrs": addrs}))
                reply = msgpack.unpackb(await asyncio.wait_for(read_frame(reader, MAX_REQUEST_BYTES), timeout),
                                        raw=False)
            finally:
                writer.close()
        except Exception as e:
            logger.debug("member %s could not check our reachability: %s", member, e)
            continue
        if not isinstance(reply, dict):
            continue
        answered = True
        if reply.get("ok") is True:
            logger.info("reachability: %s dialed us back at %s", member, ", ".join(addrs))
            return True
        logger.info("reachability: %s could not dial %s: %s", member, ", ".join(addrs), reply.get("error"))
    return False if answered else None


async def check_reachable(initial_peers: Sequence[str], host_maddrs: Sequence[str],
                          announce_maddrs: Sequence[str] | None) -> bool | None:
    """Start a short-lived daemon on our listen addresses and ask members to dial it (see ask_dial_back).

    Run before the real node starts, because a node unreachable from outside must start as a
    DHT client with a relay reservation, which cannot be switched on later.
    """
    p2p = await P2P.create(initial_peers=list(initial_peers), host_maddrs=list(host_maddrs),
                           announce_maddrs=list(announce_maddrs) if announce_maddrs else None,
                           use_relay=False, dht_mode="client")
    try:
        return await ask_dial_back(p2p, initial_peers)
    finally:
        await p2p.shutdown()


UNREACHABLE_ADVICE = (
    "other peers cannot connect to this machine ({addrs}): serving through a relay (slower; DHT client "
    "only). To serve directly, forward a TCP port on your router to this machine and run with "
    "--port PORT --public-ip YOUR_PUBLIC_IP (see docs/deployment.md)"
)
# libp2p's autorelay reserves a slot at once only with this many relay candidates, else after ~3 min.
RELAY_CANDIDATES_FOR_QUICK_START = 4
SLOW_RELAY_ADVICE = (
    "with {n} initial peer(s) libp2p waits about 3 minutes before it reserves a relay slot, and "
    "clients cannot reach this peer until then; give " + str(RELAY_CANDIDATES_FOR_QUICK_START)
    + " --initial-peers (any members of the swarm) to be reachable at once"
)
