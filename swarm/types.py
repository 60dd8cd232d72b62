"""Plain data types shared by every package: layer ranges, peer records, swarm snapshots, routes.

Nothing here does I/O or imports torch, so `routing/` can use these types in pure functions.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

PROTOCOL_VERSION = 1


@dataclass(frozen=True, order=True)
class LayerRange:
    """A half-open range of transformer layers `[start, end)`."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not (isinstance(self.start, int) and isinstance(self.end, int)):
            raise TypeError(f"LayerRange bounds must be integers, got {self.start!r}:{self.end!r}")
        if self.start < 0 or self.end <= self.start:
            raise ValueError(
                f"invalid layer range {self.start}:{self.end}: need 0 <= start < end (e.g. 0:12)"
            )

    @classmethod
    def parse(cls, text: str) -> LayerRange:
        """Parse "START:END" (half-open), e.g. "0:20"."""
        parts = text.strip().split(":")
        if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
            raise ValueError(f"cannot parse layer range {text!r}: expected START:END such as 0:20")
        return cls(int(parts[0]), int(parts[1]))

    def __len__(self) -> int:
        return self.end - self.start

    def __contains__(self, layer: object) -> bool:
        return isinstance(layer, int) and self.start <= layer < self.end

    def covers(self, other: LayerRange) -> bool:
        return self.start <= other.start and other.end <= self.end

    def __str__(self) -> str:
        return f"{self.start}:{self.end}"


class PeerState(str, enum.Enum):
    """Lifecycle of a peer's announcement; a str enum so it survives msgpack as plain text."""

    JOINING = "joining"
    ONLINE = "online"
    OFFLINE = "offline"
    # Leaving on purpose: still serves its open sessions and (as a last resort) new ones,
    # until the swarm covers its layers without it. On the wire it is state "online" plus
    # `draining: true`, so readers that predate it keep routing to a peer that still serves.
    DRAINING = "draining"


# States of a peer that answers requests: they cover layers.
SERVING = (PeerState.ONLINE, PeerState.DRAINING)


@dataclass(frozen=True)
class PeerRecord:
    """What a peer announces on the DHT for one model.

    `throughput` is in tokens per second for one decode token through ALL served layers,
    so the per-layer cost of a hop taking k of those layers is k / (len(layers) * throughput)
    seconds per token. Records tolerate unknown fields in both directions (see `from_dict`).
    """

    peer_id: str
    model: str
    layers: LayerRange
    state: PeerState = PeerState.ONLINE
    throughput: float = 1.0
    free_pages: int = 0
    total_pages: int = 0
    page_size: int = 16
    dtype: str = "float32"
    quant: str = "none"
    version: str = ""
    protocol: int = PROTOCOL_VERSION
    public_name: str = ""
    fingerprint: str = ""
    addrs: tuple[str, ...] = ()
    num_layers: int = 0  # the model's total layer count, so a view knows n without the checkpoint
    updated: float = 0.0  # wall-clock time of the announcement, for display
    relayed: bool = False  # others reach this peer only through a libp2p relay (slower; behind NAT)
    # Loading these layers to serve them instead of `layers`, which it still serves until the
    # swap (peer/server.py migrate). Balancing counts it there already; absent in older records.
    moving_to: LayerRange | None = None
    # A standby (swarm-peer serve --standby): a slow safety net, typically on a CPU, holding layers
    # that only one other peer serves, so that peer's crash leaves slow layers instead of a gap.
    # Balancing of the other peers ignores it; clients use it only where nothing else serves.
    standby: bool = False
    # While it loads a target layer by layer (a growing join or move, peer/moves.py): the layers still
    # to come, in the order they will arrive (at most MAX_LOADING_ORDER), so the next loader of a dark
    # stretch starts where this one arrives last (routing.move_load_order). Absent otherwise.
    loading_order: tuple[int, ...] | None = None
    # ... and those layers download from the network (a Hub model whose prefetch is not done), seconds a layer
    # against a fraction of one from disk: on dark layers a reaction counts it only where it serves (routing.downloads).
    downloading: bool = False

    @property
    def growing(self) -> bool:
        """Serving part of its target while the rest loads (`layers` strictly inside `moving_to`): its
        sessions keep their layers as the range grows, unlike a mover's, which fail over at the swap."""
        return self.moving_to is not None and self.moving_to.covers(self.layers) and self.moving_to != self.layers

    @property
    def last_resort(self) -> bool:
        """Routes use this peer only where nothing else serves a layer: it is draining or moving (a
        session opened here must fail over and replay before long; not one growing into its
        target), or a standby (slow)."""
        return (self.state is PeerState.DRAINING or (self.moving_to is not None and not self.growing)
                or self.standby)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue  # optional and unset: absent on the wire
            if isinstance(value, LayerRange):
                value = [value.start, value.end]
            elif isinstance(value, PeerState):
                value = PeerState.ONLINE.value if value is PeerState.DRAINING else value.value
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        if self.state is PeerState.DRAINING:
            out["draining"] = True
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PeerRecord:
        """Build a record from untrusted data: unknown keys are ignored, bad values raise ValueError.

        Every field is type- and range-checked (see RECORD_BOUNDS): a record is written by a peer we
        do not know, and whatever parses here flows into routing arithmetic and the monitor page.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"peer record must be a map, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        try:
            kwargs["layers"] = _layer_range("layers", kwargs["layers"])
            if "moving_to" in kwargs:
                kwargs["moving_to"] = _layer_range("moving_to", kwargs["moving_to"])
            kwargs["state"] = PeerState(kwargs.get("state", PeerState.ONLINE.value))
            if data.get("draining") is True and kwargs["state"] is PeerState.ONLINE:
                kwargs["state"] = PeerState.DRAINING
            addrs = kwargs.get("addrs", ())
            if not isinstance(addrs, (list, tuple)) or len(addrs) > MAX_ADDRS:
                raise ValueError(f"addrs must be a list of at most {MAX_ADDRS} strings")
            kwargs["addrs"] = tuple(_bounded_str("addrs", a) for a in addrs)
            for name, (low, high) in FLOAT_BOUNDS.items():
                if name in kwargs:
                    value = kwargs[name]
                    if type(value) not in (int, float) or not (math.isfinite(value) and low <= value <= high):
                        raise ValueError(f"{name} must be a finite number in [{low:g}, {high:g}], got {value!r:.40}")
                    kwargs[name] = float(value)
            for name, (low, high) in INT_BOUNDS.items():
                if name in kwargs and not (type(kwargs[name]) is int and low <= kwargs[name] <= high):
                    raise ValueError(f"{name} must be an int in [{low}, {high}], got {kwargs[name]!r:.40}")
            for name in ("peer_id", "model", "dtype", "quant", "version", "public_name", "fingerprint"):
                if name in kwargs:
                    kwargs[name] = _bounded_str(name, kwargs[name])
            for name in ("relayed", "standby", "downloading"):  # absent in records of older peers
                if type(kwargs.get(name, False)) is not bool:
                    raise ValueError(f"{name} must be a bool")
            if "loading_order" in kwargs:
                kwargs["loading_order"] = _loading_order(kwargs["loading_order"], kwargs.get("moving_to") or kwargs["layers"])
            record = cls(**kwargs)
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise ValueError(f"malformed peer record: {e}") from e
        for name, span in (("layers", record.layers), ("moving_to", record.moving_to)):
            if span is not None and record.num_layers and span.end > record.num_layers:
                raise ValueError(f"malformed peer record: {name} {span} outside its model's {record.num_layers}")
        return record


# Bounds on what a record may claim. Generous for any real model and peer, small enough that no
# sum or product over a swarm's records overflows or dominates (1e6 tokens/s is ~1000x a fast GPU).
MAX_NUM_LAYERS = 100_000
MAX_THROUGHPUT = 1e6
MAX_STR = 256  # chars of any string field (peer id, model name, dtype, multiaddr, ...)
MAX_ADDRS = 16
# Layers of a loading_order (the next ones to load): a loader's later steps weigh nothing in another's
# order once past that loader's own width (routing.gap_weight), and no peer holds this many layers.
MAX_LOADING_ORDER = 1024
FLOAT_BOUNDS: dict[str, tuple[float, float]] = {"throughput": (0.0, MAX_THROUGHPUT), "updated": (0.0, 1e11)}
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "free_pages": (0, 2**31), "total_pages": (0, 2**31), "page_size": (1, 2**16),
    "protocol": (0, 2**16), "num_layers": (0, MAX_NUM_LAYERS),
}


def _layer_range(name: str, value: Any) -> LayerRange:
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(type(x) is int for x in value)):
        raise ValueError(f"{name} must be two ints, got {value!r:.60}")
    if value[1] > MAX_NUM_LAYERS:
        raise ValueError(f"{name} end {value[1]} is above {MAX_NUM_LAYERS}")
    return LayerRange(value[0], value[1])


def _loading_order(value: Any, target: LayerRange) -> tuple[int, ...]:
    """A record's `loading_order`: distinct layers of the target it loads (`moving_to`, else `layers`)."""
    if not (isinstance(value, (list, tuple)) and len(value) <= MAX_LOADING_ORDER
            and all(type(x) is int and target.start <= x < target.end for x in value)
            and len(set(value)) == len(value)):
        raise ValueError(f"loading_order must be at most {MAX_LOADING_ORDER} distinct layers of {target}, "
                         f"got {value!r:.60}")
    return tuple(value)


def _bounded_str(name: str, value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_STR:
        raise ValueError(f"{name} must be a string of at most {MAX_STR} chars")
    return value


@dataclass(frozen=True)
class SwarmView:
    """An immutable snapshot of who serves which layers of one model.

    `rtt` maps peer id -> measured round-trip time in seconds, where the viewer measured it.
    """

    model: str
    num_layers: int
    records: Mapping[str, PeerRecord] = field(default_factory=dict)
    rtt: Mapping[str, float] = field(default_factory=dict)

    def online(self) -> list[PeerRecord]:
        return [r for r in self.records.values() if r.state is PeerState.ONLINE]

    def peers_serving(self, layer: int) -> list[PeerRecord]:
        return [r for r in self.online() if layer in r.layers]

    def uncovered_layers(self, *, standbys: bool = True) -> list[int]:
        """Layers no ONLINE or DRAINING peer serves (standbys=False: no such peer but standbys)."""
        covered = [False] * self.num_layers
        for r in self.records.values():
            if r.state not in SERVING or (r.standby and not standbys):
                continue
            for layer in range(r.layers.start, min(r.layers.end, self.num_layers)):
                covered[layer] = True
        return [i for i, ok in enumerate(covered) if not ok]


@dataclass(frozen=True)
class Hop:
    """One step of a route: send hidden states of layers `layers` to peer `peer_id`."""

    peer_id: str
    layers: LayerRange


Route = tuple[Hop, ...]
