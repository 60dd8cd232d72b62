"""`/metrics`: the monitor's state in Prometheus text format.

A custom collector on a private CollectorRegistry turns the current state dict into metric
families at scrape time, so peers that left the swarm simply stop appearing (no stale label
sets to clean up, as gauges with .labels() would leave behind) and nothing leaks into the
process-wide default registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from swarm.types import PeerState

P = "layerswarm_monitor_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class StateCollector(Collector):
    def __init__(self, get_state: Callable[[], Mapping[str, Any]]) -> None:
        self.get_state = get_state

    def collect(self) -> Iterator[Metric]:
        state = self.get_state()
        models = state.get("models", [])
        up = GaugeMetricFamily(P + "stale", "1 if the data is stale (last refresh failed or too old)")
        up.add_metric([], 1.0 if state.get("stale") else 0.0)
        yield up
        last = GaugeMetricFamily(P + "last_refresh_timestamp_seconds", "Unix time of the last good refresh")
        if state.get("refreshed_at") is not None:
            last.add_metric([], float(state["refreshed_at"]))
        yield last

        coverage = GaugeMetricFamily(P + "model_coverage_ratio", "Fraction of layers served by >= 1 online reachable peer", labels=["model"])
        healthy = GaugeMetricFamily(P + "model_healthy", "1 if every layer is served by an online reachable peer", labels=["model"])
        layers = GaugeMetricFamily(P + "model_layers", "Number of layers of the model", labels=["model"])
        through = GaugeMetricFamily(P + "model_throughput_tokens_per_second", "Sum of serving peers' throughput", labels=["model"])
        peers_n = GaugeMetricFamily(P + "model_peers", "Announced peers by state", labels=["model", "state"])
        for m in models:
            coverage.add_metric([m["name"]], m["coverage"])
            healthy.add_metric([m["name"]], 1.0 if m["healthy"] else 0.0)
            layers.add_metric([m["name"]], m["num_layers"])
            through.add_metric([m["name"]], m["throughput"])
            for s in PeerState:
                peers_n.add_metric([m["name"], s.value], m["peer_counts"][s.value])
        yield from (coverage, healthy, layers, through, peers_n)
        yield from self.peer_metrics(models)

    def peer_metrics(self, models: list[Mapping[str, Any]]) -> Iterator[Metric]:
        labels = ["model", "peer"]
        info = GaugeMetricFamily(P + "peer_info", "Peer description (always 1)", labels=[*labels, "name", "version", "dtype", "quant", "layers"])
        throughput = GaugeMetricFamily(P + "peer_throughput_tokens_per_second", "Announced throughput through all served layers", labels=labels)
        free = GaugeMetricFamily(P + "peer_free_pages", "Free KV cache pages", labels=labels)
        total = GaugeMetricFamily(P + "peer_total_pages", "KV cache pages in total", labels=labels)
        rtt = GaugeMetricFamily(P + "peer_rtt_seconds", "Round-trip time of an info request from the monitor", labels=labels)
        reachable = GaugeMetricFamily(P + "peer_reachable", "1 if the peer answered the monitor's info request", labels=labels)
        # One series per possible state, value 1 for the current one (the usual enum pattern).
        state = GaugeMetricFamily(P + "peer_state", "1 for the peer's current state", labels=[*labels, "state"])
        # What the peer refused and why (limits exceeded, bad frames, strangers), as the peer counts it.
        refused = CounterMetricFamily(P + "peer_refused_requests", "Requests the peer answered with an error, by code",
                                      labels=[*labels, "code"])
        reported = GaugeMetricFamily(P + "peer_reports", "Clients that reported the peer for returning wrong results",
                                     labels=labels)
        limited = CounterMetricFamily(P + "peer_limit_hits", "Requests refused by one of the peer's limits, by limit",
                                      labels=[*labels, "limit"])
        for m in models:
            for p in m["peers"]:
                key = [m["name"], p["peer_id"]]
                a, b = p["layers"]
                info.add_metric([*key, p["public_name"], p["version"], p["dtype"], p["quant"], f"{a}:{b}"], 1.0)
                throughput.add_metric(key, p["throughput"])
                free.add_metric(key, p["free_pages"])
                total.add_metric(key, p["total_pages"])
                if p["rtt_ms"] is not None:
                    rtt.add_metric(key, p["rtt_ms"] / 1000)
                if p["reachable"] is not None:
                    reachable.add_metric(key, 1.0 if p["reachable"] else 0.0)
                for s in PeerState:
                    state.add_metric([*key, s.value], 1.0 if p["state"] == s.value else 0.0)
                reported.add_metric(key, float(p.get("reports", 0)))
                stats = p.get("stats") or {}
                for family, source in ((refused, "errors"), (limited, "refusals")):
                    for name, count in (stats.get(source) or {}).items():
                        if isinstance(name, str) and isinstance(count, (int, float)):
                            family.add_metric([*key, name], float(count))
        yield from (info, throughput, free, total, rtt, reachable, state, refused, limited, reported)


def make_registry(get_state: Callable[[], Mapping[str, Any]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(get_state))
    return registry


def render_metrics(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
