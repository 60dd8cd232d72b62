"""Hostile records and stats reaching the monitor: NaN, bytes, lists or out-of-range values in a
peer's `info` reply must not make `/api/v1/state` or `/metrics` answer 500 (before: NaN or bytes
in stats did), and a live record is range-checked like a DHT record."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from client.monitor.app import make_app
from client.monitor.collector import Collector
from client.monitor.state import Probe, build_state, clean_stats
from swarm.types import LayerRange, PeerRecord, SwarmView

HOSTILE_STATS = {
    "sessions": float("nan"), "uptime": float("inf"), "blob": b"\x00\xff", "queued_steps": 3, "big": 10**400,
    "nested": {"deep": {"deeper": 1}}, "list": [1, 2, 3], "errors": {"busy": 2, "bad": float("nan"), 7: 1},
    "refusals": ["not", "a", "map"], "name": "x" * 10_000, 42: "non-str key",
}


def test_clean_stats_keeps_only_safe_values() -> None:
    assert clean_stats(HOSTILE_STATS) == {"queued_steps": 3, "nested": {}, "errors": {"busy": 2}}
    assert clean_stats(b"bytes") is None and clean_stats(None) is None
    assert len(clean_stats({f"k{i}": i for i in range(10_000)})) == 64


class HostileCollector(Collector):
    def __init__(self) -> None:
        record = PeerRecord(peer_id="p1", model="tiny", layers=LayerRange(0, 4), num_layers=4)
        live = {**record.to_dict(), "layers": [0, float("inf")], "throughput": float("nan")}
        super().__init__(node=None, probe=None, refresh=2.0, dht_timeout=1.0)  # type: ignore[arg-type]
        probes = {"p1": Probe("p1", True, 0.003, info={"record": live, "stats": HOSTILE_STATS})}
        self.state = build_state([SwarmView("tiny", 4, {"p1": record})], probes, 1e12, 2.0)


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(make_app(HostileCollector(), stale_after=30.0))) as c:
        yield c


async def test_hostile_peer_info_does_not_break_the_monitor(client: TestClient) -> None:
    r = await client.get("/api/v1/state")
    assert r.status == 200
    peer = (await r.json())["models"][0]["peers"][0]
    assert peer["layers"] == [0, 4] and peer["stats"]["errors"] == {"busy": 2}
    assert (await client.get("/metrics")).status == 200
    assert (await client.get("/")).status == 200
