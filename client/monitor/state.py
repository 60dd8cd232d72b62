"""Build the monitor's state dict from DHT views and `info` answers: pure functions, no I/O.

The dict built here is exactly what `/api/v1/state` returns (documented in docs/monitor.md),
and the page and the Prometheus metrics are both rendered from it, so the three never disagree.
Field names are part of the public API: add fields, never rename them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from swarm.types import PeerRecord, PeerState, SwarmView

STATE_VERSION = 1
SHORT_ID_CHARS = 8  # enough to tell peers apart on a page; the full id is in the JSON and tooltip
MAX_STATS = 64  # entries of a peer's stats (and of each nested map) kept for display
MAX_STAT_CHARS = 200  # a stat's name or text value


@dataclass(frozen=True)
class Probe:
    """The outcome of one `info` request to a peer, as seen from the monitor."""

    peer_id: str
    reachable: bool
    rtt: float | None = None  # seconds for the info request on an open stream
    error: str | None = None  # why it failed (timeout, refused, remote error), for display
    info: Mapping[str, Any] | None = None  # the peer's reply: {"record": {...}, "stats": {...}}
    at: float = 0.0  # wall-clock time of the probe


def short_id(peer_id: str) -> str:
    # base58 libp2p ids all start with "12D3Koo" / "Qm": the tail is what differs between peers.
    return peer_id[-SHORT_ID_CHARS:] if len(peer_id) > SHORT_ID_CHARS else peer_id


def fresher_record(announced: PeerRecord, probe: Probe | None) -> PeerRecord:
    """The record the peer itself returned over `info` when it is valid, else the DHT's.

    The live answer is newer than the announcement (up to ttl/3 old) but is untrusted input:
    a reply naming another peer or model is ignored rather than believed.
    """
    if probe is None or not probe.reachable or not probe.info:
        return announced
    try:
        live = PeerRecord.from_dict(probe.info.get("record", {}))
    except (ValueError, AttributeError):
        return announced
    if (live.peer_id != announced.peer_id or live.model != announced.model
            or live.num_layers != announced.num_layers):  # its layers were range-checked against this
        return announced
    return live


def layer_ranges(flags: Iterable[bool]) -> list[list[int]]:
    """Half-open [start, end) runs of consecutive True flags, e.g. gaps from "is uncovered"."""
    runs: list[list[int]] = []
    for i, flag in enumerate(flags):
        if not flag:
            continue
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def _stat_value(value: Any) -> bool:
    """JSON- and Prometheus-safe: a finite number (no NaN: `/api/v1/state` refuses it) or a short string."""
    if type(value) in (int, bool):
        return abs(value) < 2**63
    if type(value) is float:
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_STAT_CHARS


def clean_stats(stats: Any) -> dict[str, Any] | None:
    """A peer's `info` stats, as reported by a peer we do not trust, reduced to what we can show.

    Keeps str names with finite numbers or short strings, and one level of maps of those
    (`errors`, `refusals`); drops anything else (NaN, bytes, lists, deep maps) entry by entry.
    """
    if not isinstance(stats, Mapping):
        return None
    out: dict[str, Any] = {}
    for name, value in itertools.islice(stats.items(), MAX_STATS):
        if not isinstance(name, str) or len(name) > MAX_STAT_CHARS:
            continue
        if isinstance(value, Mapping):
            out[name] = {k: v for k, v in itertools.islice(value.items(), MAX_STATS)
                         if isinstance(k, str) and len(k) <= MAX_STAT_CHARS and _stat_value(v) and not isinstance(v, str)}
        elif _stat_value(value):
            out[name] = value
    return out


def peer_entry(record: PeerRecord, probe: Probe | None, reports: int = 0) -> dict[str, Any]:
    stats = probe.info.get("stats") if probe is not None and isinstance(probe.info, Mapping) else None
    return {
        "peer_id": record.peer_id,
        "short_id": short_id(record.peer_id),
        "public_name": record.public_name,
        "layers": [record.layers.start, record.layers.end],
        "state": record.state.value,
        # Loading these layers to serve them instead (it serves `layers` until the swap).
        "moving_to": None if record.moving_to is None else [record.moving_to.start, record.moving_to.end],
        "throughput": record.throughput,
        "free_pages": record.free_pages,
        "total_pages": record.total_pages,
        "page_size": record.page_size,
        "dtype": record.dtype,
        "quant": record.quant,
        "version": record.version,
        "updated": record.updated,
        "standby": record.standby,  # a slow safety net, used by clients only where nothing else serves
        "relayed": record.relayed,  # reachable only through a libp2p relay (behind NAT)
        # None = not probed yet (first refresh still running): neither good nor bad news.
        "reachable": None if probe is None else probe.reachable,
        "rtt_ms": None if probe is None or probe.rtt is None else round(probe.rtt * 1000, 2),
        "error": None if probe is None else probe.error,
        "stats": clean_stats(stats),
        # Clients that caught this peer returning wrong results (client verification, DHT reports).
        "reports": reports,
    }


SERVING_STATES = (PeerState.ONLINE.value, PeerState.DRAINING.value)


def counts_as_serving(peer: Mapping[str, Any]) -> bool:
    """ONLINE (or DRAINING: leaving, still serving) and answering: a peer that cannot be reached serves nobody."""
    return peer["state"] in SERVING_STATES and peer["reachable"] is True


def model_state(
    view: SwarmView, probes: Mapping[str, Probe], reports: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """One model's health: per-layer coverage, gaps, throughput and its peers (sorted by layers)."""
    records = [fresher_record(r, probes.get(r.peer_id)) for r in view.records.values()]
    reports = reports or {}
    peers = [peer_entry(r, probes.get(r.peer_id), reports.get(r.peer_id, 0)) for r in records]
    peers.sort(key=lambda p: (p["layers"][0], p["layers"][1], p["public_name"], p["peer_id"]))
    # A peer may announce more layers than the registry knows (e.g. registry entry expired).
    n = max([view.num_layers, *(r.num_layers for r in records), *(r.layers.end for r in records)])

    online = [0] * n
    joining = [0] * n
    capacity = [0.0] * n  # tokens/s each layer can pass if its peers did nothing else
    for peer in peers:
        start, end = peer["layers"]
        for layer in range(start, min(end, n)):
            if counts_as_serving(peer):
                online[layer] += 1
                capacity[layer] += peer["throughput"]
            elif peer["state"] == PeerState.JOINING.value:
                joining[layer] += 1
        if peer["moving_to"] is not None:  # loading its target: a joiner there, a server where it is
            for layer in range(peer["moving_to"][0], min(peer["moving_to"][1], n)):
                joining[layer] += 1
    gaps = layer_ranges(count == 0 for count in online)
    serving = [p for p in peers if counts_as_serving(p)]
    return {
        "name": view.model,
        "num_layers": n,
        "healthy": n > 0 and not gaps,
        "coverage": (n - sum(b - a for a, b in gaps)) / n if n else 0.0,
        "gaps": gaps,
        "layers": [{"index": i, "online": online[i], "joining": joining[i]} for i in range(n)],
        # Sum over serving peers: how much work the swarm does for this model in total.
        "throughput": round(sum(p["throughput"] for p in serving), 3),
        # The pipeline's ceiling: the weakest layer's capacity (0 while there is a gap).
        "bottleneck_throughput": round(min(capacity), 3) if n else 0.0,
        "peer_counts": {
            "total": len(peers),
            "serving": len(serving),
            "unreachable": sum(1 for p in peers if p["reachable"] is False),
            **{s.value: sum(1 for p in peers if p["state"] == s.value) for s in PeerState},
        },
        "peers": peers,
    }


def build_state(
    views: Iterable[SwarmView],
    probes: Mapping[str, Probe],
    refreshed_at: float | None,
    refresh_interval: float,
    error: str | None = None,
    reports: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """The whole swarm as the monitor saw it at `refreshed_at` (None: nothing collected yet).

    `reports`: model -> peer id -> how many clients reported the peer for wrong results.
    """
    reports = reports or {}
    models = sorted((model_state(v, probes, reports.get(v.model)) for v in views), key=lambda m: m["name"])
    return {
        "version": STATE_VERSION,
        "refreshed_at": refreshed_at,
        "refresh_interval": refresh_interval,
        "error": error,
        "stale": refreshed_at is None or error is not None,
        "models": models,
    }


def mark_failed(previous: Mapping[str, Any], error: str) -> dict[str, Any]:
    """Keep serving the last good data when a refresh fails, flagged stale with the reason."""
    return {**previous, "error": error, "stale": True}


def with_age(state: Mapping[str, Any], now: float, stale_after: float) -> dict[str, Any]:
    """Add `age` and re-judge `stale` at serving time: a refresh loop that hangs shows up too."""
    refreshed = state.get("refreshed_at")
    age = None if refreshed is None else max(0.0, now - refreshed)
    stale = bool(state.get("stale")) or age is None or age > stale_after
    return {**state, "age": None if age is None else round(age, 3), "stale": stale, "now": now}


def select_model(state: Mapping[str, Any], model: str | None) -> dict[str, Any] | None:
    """The state restricted to one model (None if it is not in the swarm); all models if None."""
    if model is None:
        return dict(state)
    chosen = [m for m in state.get("models", []) if m["name"] == model]
    return {**state, "models": chosen} if chosen else None
