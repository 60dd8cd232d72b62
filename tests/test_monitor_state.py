"""Unit tests of the monitor's state building, collector fallback, page escaping and metrics (no network)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from client.monitor.collector import Collector
from client.monitor.metrics import make_registry, render_metrics
from client.monitor.page import peer_row, render_page
from client.monitor.state import (
    Probe,
    build_state,
    layer_ranges,
    mark_failed,
    model_state,
    select_model,
    with_age,
)
from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView

MODEL = "m"


def rec(pid: str, a: int, b: int, state: PeerState = PeerState.ONLINE, n: int = 6, **kw: object) -> PeerRecord:
    return PeerRecord(peer_id=pid, model=MODEL, layers=LayerRange(a, b), state=state, num_layers=n, **kw)


def view(*records: PeerRecord, n: int = 6) -> SwarmView:
    return SwarmView(MODEL, n, {r.peer_id: r for r in records})


def ok(*pids: str) -> dict[str, Probe]:
    return {pid: Probe(pid, True, 0.01, None, {"record": {}}) for pid in pids}


def test_full_coverage_is_healthy_with_per_layer_counts() -> None:
    m = model_state(view(rec("a", 0, 4, throughput=10.0), rec("b", 2, 6, throughput=5.0)), ok("a", "b"))
    assert m["healthy"] and m["coverage"] == 1.0 and m["gaps"] == []
    assert [c["online"] for c in m["layers"]] == [1, 1, 2, 2, 1, 1]
    assert m["throughput"] == 15.0
    assert m["bottleneck_throughput"] == 5.0  # layers 4-5 only have b
    assert [p["peer_id"] for p in m["peers"]] == ["a", "b"]


def test_gaps_are_half_open_runs_and_break_health() -> None:
    m = model_state(view(rec("a", 0, 2), rec("b", 3, 4)), ok("a", "b"))
    assert not m["healthy"]
    assert m["gaps"] == [[2, 3], [4, 6]]
    assert m["coverage"] == pytest.approx(3 / 6)
    assert m["bottleneck_throughput"] == 0.0
    assert layer_ranges([True, True, False, True]) == [[0, 2], [3, 4]]


def test_joining_peers_are_counted_apart_and_do_not_cover() -> None:
    m = model_state(view(rec("a", 0, 6), rec("j", 3, 6, PeerState.JOINING)), ok("a", "j"))
    assert m["healthy"]
    assert [c["joining"] for c in m["layers"]] == [0, 0, 0, 1, 1, 1]
    assert [c["online"] for c in m["layers"]] == [1] * 6
    only_joining = model_state(view(rec("a", 0, 3), rec("j", 3, 6, PeerState.JOINING)), ok("a", "j"))
    assert not only_joining["healthy"] and only_joining["gaps"] == [[3, 6]]
    assert only_joining["peer_counts"]["joining"] == 1 and only_joining["peer_counts"]["serving"] == 1


def test_a_moving_peer_covers_its_old_layers_and_shows_its_target_loading() -> None:
    m = model_state(view(rec("a", 0, 3), rec("m", 3, 6, moving_to=LayerRange(0, 3))), ok("a", "m"))
    assert m["healthy"] and [c["online"] for c in m["layers"]] == [1] * 6  # it serves 3:6 until its swap
    assert [c["joining"] for c in m["layers"]] == [1, 1, 1, 0, 0, 0]
    mover = next(p for p in m["peers"] if p["peer_id"] == "m")
    assert mover["moving_to"] == [0, 3] and "moving to 0:3" in peer_row(mover, 6)


def test_a_standby_covers_and_is_marked() -> None:
    standby = rec("s", 3, 6, standby=True)
    m = model_state(view(rec("a", 0, 3), standby), ok("a", "s"))
    assert m["healthy"] and [c["online"] for c in m["layers"]] == [1] * 6  # slow, but served
    entry = next(p for p in m["peers"] if p["peer_id"] == "s")
    assert entry["standby"] and "standby" in peer_row(entry, 6)
    assert "standby" not in peer_row(next(p for p in m["peers"] if p["peer_id"] == "a"), 6)


def test_unreachable_and_offline_peers_do_not_cover() -> None:
    probes = {**ok("a"), "b": Probe("b", False, None, "timed out")}
    m = model_state(view(rec("a", 0, 3), rec("b", 3, 6), rec("c", 3, 6, PeerState.OFFLINE)), {**probes, **ok("c")})
    assert m["gaps"] == [[3, 6]] and not m["healthy"]
    b = next(p for p in m["peers"] if p["peer_id"] == "b")
    assert b["reachable"] is False and b["error"] == "timed out" and b["rtt_ms"] is None
    assert m["peer_counts"]["unreachable"] == 1 and m["peer_counts"]["offline"] == 1


def test_not_yet_probed_peer_is_neither_reachable_nor_serving() -> None:
    m = model_state(view(rec("a", 0, 6)), {})
    assert m["peers"][0]["reachable"] is None and not m["healthy"]


def test_live_info_record_wins_unless_it_names_another_peer() -> None:
    live = rec("a", 0, 6, free_pages=7, total_pages=9).to_dict()
    m = model_state(view(rec("a", 0, 3)), {"a": Probe("a", True, 0.002, None, {"record": live, "stats": {"sessions": 2}})})
    peer = m["peers"][0]
    assert peer["layers"] == [0, 6] and peer["free_pages"] == 7 and peer["stats"] == {"sessions": 2}
    assert peer["rtt_ms"] == 2.0 and m["healthy"]
    liar = {**live, "peer_id": "zzz"}
    m = model_state(view(rec("a", 0, 3)), {"a": Probe("a", True, 0.002, None, {"record": liar})})
    assert m["peers"][0]["layers"] == [0, 3]


def test_num_layers_grows_to_what_peers_announce() -> None:
    m = model_state(SwarmView(MODEL, 0, {"a": rec("a", 0, 8, n=8)}), ok("a"))
    assert m["num_layers"] == 8 and len(m["layers"]) == 8
    empty = model_state(SwarmView(MODEL, 0, {}), {})
    assert empty["num_layers"] == 0 and not empty["healthy"] and empty["coverage"] == 0.0


def test_stale_flags() -> None:
    state = build_state([view(rec("a", 0, 6))], ok("a"), refreshed_at=100.0, refresh_interval=2.0)
    assert state["stale"] is False and state["error"] is None
    assert with_age(state, now=101.0, stale_after=10)["stale"] is False
    assert with_age(state, now=101.0, stale_after=10)["age"] == 1.0
    assert with_age(state, now=200.0, stale_after=10)["stale"] is True  # refresh loop stuck
    failed = mark_failed(state, "DHT unreachable: timed out")
    assert failed["stale"] and failed["error"] == "DHT unreachable: timed out"
    assert failed["models"] == state["models"] and failed["refreshed_at"] == 100.0
    first = build_state([], {}, None, 2.0)
    assert first["stale"] and with_age(first, 1.0, 10)["age"] is None


def test_select_model() -> None:
    state = build_state([view(rec("a", 0, 6))], ok("a"), 1.0, 2.0)
    assert select_model(state, None) == state
    assert [m["name"] for m in select_model(state, MODEL)["models"]] == [MODEL]
    assert select_model(state, "other") is None


class FakeDht:
    def __init__(self) -> None:
        self.fail = False
        self.records = [rec("a", 0, 3), rec("b", 3, 6)]

    async def list_models_async(self) -> dict[str, int]:
        if self.fail:
            raise ConnectionError("p2pd went away")
        return {MODEL: 6}

    async def fetch_view_async(self, model: str, num_layers: int | None = None) -> SwarmView:
        return view(*self.records)


async def test_collector_probes_in_parallel_and_keeps_last_state_when_dht_fails() -> None:
    dht = FakeDht()
    running = 0
    most = 0

    async def probe(pid: str) -> Probe:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1
        return Probe(pid, pid != "b", 0.01 if pid != "b" else None, None if pid != "b" else "timed out")

    collector = Collector(dht, probe, refresh=1.0, dht_timeout=1.0)
    state = await collector.refresh_once()
    assert most == 2  # both peers probed at once
    assert not state["stale"] and state["models"][0]["gaps"] == [[3, 6]]
    dht.fail = True
    stale = await collector.refresh_once()
    assert stale["stale"] and "p2pd went away" in stale["error"]
    assert stale["models"] == state["models"] and stale["refreshed_at"] == state["refreshed_at"]
    dht.fail = False
    dht.records = [rec("a", 0, 6)]
    again = await collector.refresh_once()
    assert not again["stale"] and again["error"] is None and again["models"][0]["healthy"]
    assert set(collector.probes) == {"a"}  # departed peers are forgotten


def test_page_escapes_peer_strings() -> None:
    evil = '<script>alert(1)</script>'
    r = rec("a\"><b>", 0, 6, public_name=evil, version="<img src=x onerror=alert(2)>", dtype="<i>")
    state = with_age(build_state([view(r)], ok(r.peer_id), 1.0, 2.0), 2.0, 10)
    html = render_page(state, "n0nce")
    assert evil not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img" not in html and "<i>" not in html and 'a"><b>' not in html
    assert html.count("<script") == 1  # only ours, with its nonce
    assert 'nonce="n0nce"' in html


def test_metrics_parse_and_carry_labels() -> None:
    probes = {**ok("a"), "b": Probe("b", False, None, "refused")}
    state = build_state([view(rec("a", 0, 3, throughput=4.0, free_pages=5), rec("b", 3, 6))], probes, 1.0, 2.0)
    text = render_metrics(make_registry(lambda: state)).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("layerswarm_monitor_model_coverage_ratio", (("model", MODEL),))] == 0.5
    assert samples[("layerswarm_monitor_model_healthy", (("model", MODEL),))] == 0.0
    key = (("model", MODEL), ("peer", "a"))
    assert samples[("layerswarm_monitor_peer_throughput_tokens_per_second", key)] == 4.0
    assert samples[("layerswarm_monitor_peer_free_pages", key)] == 5.0
    assert samples[("layerswarm_monitor_peer_rtt_seconds", key)] == pytest.approx(0.01)
    assert samples[("layerswarm_monitor_peer_reachable", (("model", MODEL), ("peer", "b")))] == 0.0
    assert samples[("layerswarm_monitor_peer_state", (*key, ("state", "online")))] == 1.0


def test_reports_of_lying_peers_reach_state_page_and_metrics() -> None:
    probes = {p: Probe(p, True, 0.01, None, {"record": {}, "stats": {"errors": {"rate_limited": 3},
                                                                      "refusals": {"no_pages": 1}}})
              for p in ("a", "b")}
    state = build_state([view(rec("a", 0, 3), rec("b", 3, 6))], probes, 1.0, 2.0, reports={MODEL: {"b": 2}})
    peers = {p["peer_id"]: p for p in state["models"][0]["peers"]}
    assert peers["a"]["reports"] == 0 and peers["b"]["reports"] == 2
    assert 'data-label="Reports"><span class="bad">2</span>' in render_page(state, "n")
    text = render_metrics(make_registry(lambda: state)).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    key = (("model", MODEL), ("peer", "b"))
    assert samples[("layerswarm_monitor_peer_reports", key)] == 2.0
    assert samples[("layerswarm_monitor_peer_refused_requests_total", (("code", "rate_limited"), *key))] == 3.0
    assert samples[("layerswarm_monitor_peer_limit_hits_total", (("limit", "no_pages"), *key))] == 1.0
