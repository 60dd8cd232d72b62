"""Reachability: address options, the join line, relayed records and their routing cost, dial-back.

The dial-back tests start real DHT nodes and p2p daemons on 127.0.0.1. A peer behind a real NAT
(network namespaces) is in tests/test_reachability_netns.py.
"""

from __future__ import annotations

import asyncio

import pytest

from client.monitor.page import reach_cell
from client.monitor.state import peer_entry
from routing.route import plan_route
from swarm.dht import SwarmNode
from swarm.reachability import (
    AddressError,
    DialBackService,
    check_reachable,
    join_advice,
    join_maddr,
    machine_ips,
    machine_of,
    parse_peer_maddr,
    plan_addresses,
)
from swarm.types import LayerRange, PeerRecord
from tests.routing_helpers import hops, rec, view

PID = "QmXBhWTUnBnYfWrN3NwVpNT3Sxp2B9t7iRCLaaBNGZBLdN"


def test_port_and_public_ip_shorthand() -> None:
    plan = plan_addresses(public_ip="203.0.113.5", port=31337)
    assert plan.host == ("/ip4/0.0.0.0/tcp/31337", "/ip4/0.0.0.0/udp/31337/quic")
    assert plan.announce == ("/ip4/203.0.113.5/tcp/31337", "/ip4/203.0.113.5/udp/31337/quic")
    assert plan_addresses(public_ip="2001:db8::1", port=5).announce[0] == "/ip6/2001:db8::1/tcp/5"
    default = plan_addresses()
    assert default.host == ("/ip4/127.0.0.1/tcp/0",) and default.announce is None
    explicit = plan_addresses(["/ip4/0.0.0.0/tcp/4000"], ["/dns4/peer.example.org/tcp/4000"])
    assert explicit.host == ("/ip4/0.0.0.0/tcp/4000",) and explicit.announce == ("/dns4/peer.example.org/tcp/4000",)
    for kwargs, message in [
        (dict(public_ip="203.0.113.5"), "needs --port"),
        (dict(public_ip="my-router", port=1), "not an IP address"),
        (dict(port=0), "not a TCP port"),
        (dict(host_maddrs=["0.0.0.0:1"]), "not a multiaddr"),
    ]:
        with pytest.raises(AddressError, match=message):
            plan_addresses(**kwargs)


def test_initial_peer_addresses_are_checked() -> None:
    assert parse_peer_maddr(f"/ip4/10.0.0.2/tcp/31337/p2p/{PID}")
    for bad, message in [("garbage", "not a multiaddr"), ("/ip4/10.0.0.2/tcp/31337", "lacks the /p2p/"),
                         (f"/ip4/10.0.0.2/p2p/{PID}", "names no port")]:
        with pytest.raises(AddressError, match=message):
            parse_peer_maddr(bad)


def test_join_line_prefers_public_then_private_then_loopback() -> None:
    loop, lan, wan = (f"/ip4/{ip}/tcp/1/p2p/{PID}" for ip in ("127.0.0.1", "192.168.1.7", "93.184.216.34"))
    quic = f"/ip4/93.184.216.34/udp/1/quic/p2p/{PID}"
    relay = f"/ip4/93.184.216.35/tcp/1/p2p/QmRelay/p2p-circuit/p2p/{PID}"
    assert join_maddr([loop, quic, lan, wan, relay]) == wan
    assert join_maddr([loop, relay, lan]) == lan
    assert join_maddr([loop, relay]) == relay
    assert "--initial-peers " + lan in join_advice([loop, lan]) and "loopback" not in join_advice([lan])
    assert "loopback only" in join_advice([loop]) and "--port" in join_advice([loop])


def test_machine_ips_name_the_machine_but_not_loopback_or_relays() -> None:
    addrs = ["/ip4/203.0.113.5/tcp/31337/p2p/QmA", "/ip4/127.0.0.1/tcp/31337/p2p/QmA", "/ip4/0.0.0.0/tcp/1",
             "/ip4/198.51.100.1/tcp/4001/p2p/QmR/p2p-circuit/p2p/QmA", "/ip6/2001:db8::1/udp/5/quic-v1"]
    assert machine_ips(addrs) == {"203.0.113.5", "2001:db8::1"}  # the relay's IP is not ours
    assert machine_ips(["/ip4/127.0.0.1/tcp/1"]) == set()  # a local swarm: every peer on one address
    assert machine_of(addrs) == "2001:db8::1" and machine_of(["/ip4/127.0.0.1/tcp/1"]) is None


def test_relayed_field_old_records_and_bad_values() -> None:
    record = PeerRecord(peer_id=PID, model="m", layers=LayerRange(0, 2), relayed=True)
    assert PeerRecord.from_dict(record.to_dict()).relayed is True
    old = record.to_dict()
    del old["relayed"]  # a peer from before the field existed
    assert PeerRecord.from_dict(old).relayed is False
    with pytest.raises(ValueError, match="relayed must be a bool"):
        PeerRecord.from_dict(dict(record.to_dict(), relayed="yes"))


def test_routing_prefers_direct_peers_but_uses_relayed_ones() -> None:
    direct, relayed = rec("direct", "0:4"), rec("relayed", "0:4")
    relayed = PeerRecord(**{**relayed.__dict__, "relayed": True})
    assert hops(plan_route(view(4, relayed, direct))) == [("direct", "0:4")]
    assert hops(plan_route(view(4, relayed))) == [("relayed", "0:4")]  # the only server is still used
    faster = PeerRecord(**{**relayed.__dict__, "throughput": 10.0})  # 0.1 s/token instead of 1 s
    assert hops(plan_route(view(4, faster, direct))) == [("relayed", "0:4")]


def test_monitor_shows_relayed() -> None:
    record = PeerRecord(peer_id=PID, model="m", layers=LayerRange(0, 2), relayed=True)
    entry = peer_entry(record, None)
    assert entry["relayed"] is True
    assert "via relay" in reach_cell(dict(entry, reachable=True))
    assert "via relay" not in reach_cell(dict(entry, reachable=True, relayed=False))


@pytest.mark.slow
def test_dial_back_tells_reachable_from_unreachable() -> None:
    """A member dials a joining peer's announced address from a separate probe daemon."""

    async def main() -> tuple[bool | None, bool | None, bool | None]:
        loop = asyncio.get_running_loop()
        member = await loop.run_in_executor(None, lambda: SwarmNode(host_maddrs=["/ip4/127.0.0.1/tcp/0"]))
        p2p = await member.replicate_p2p()
        service = DialBackService()
        try:
            await service.attach(p2p)
            initial = member.visible_maddrs()
            reachable = await check_reachable(initial, ["/ip4/127.0.0.1/tcp/0"], None)
            # Announcing a port nothing listens on: what a peer behind NAT announces, in effect.
            unreachable = await check_reachable(initial, ["/ip4/127.0.0.1/tcp/0"], ["/ip4/127.0.0.1/tcp/1"])
            await p2p.remove_binary_stream_handler("layerswarm/reachability/v1")
            unknown = await check_reachable(initial, ["/ip4/127.0.0.1/tcp/0"], None)  # nobody can answer
            return reachable, unreachable, unknown
        finally:
            await service.close()
            await p2p.shutdown()
            member.shutdown()

    assert asyncio.run(main()) == (True, False, None)
