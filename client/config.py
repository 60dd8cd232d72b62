"""`ClientConfig`: how a client finds and uses the swarm; building one does no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

QUANT_PRECISION = ("int4", "int8", "none")  # a peer's announced quantization, least precise first


@dataclass(frozen=True)
class ClientConfig:
    initial_peers: tuple[str, ...] = ()
    model_name: str | None = None  # name in the DHT; default: the checkpoint folder's name
    step_timeout: float = 30.0  # seconds for one hop to answer a step before we fail over
    connect_timeout: float = 15.0
    # A hop that has not answered a step for this long is probed (an info request, this long a
    # timeout): a vanished host (no stream closed) fails over in seconds, not step_timeout (client/stall.py).
    stall_probe_s: float = 2.0
    # ... or, once a session has timed the hop's decode steps, after four of them, but never sooner than
    # this (nor a shorter probe timeout): a probe takes a few round trips, 0.3 s each over a relay.
    stall_probe_min_s: float = 1.0
    max_retries: int = 5  # failovers per step before giving up with an error
    retry_backoff: float = 0.5  # seconds, doubled after every failed attempt of one step
    push: bool = True  # peers pass decode steps straight on (faster in benchmarks/bench_client_modes.py)
    view_max_age: float = 5.0  # re-read the DHT when the cached view is older than this
    verify: float = 0.0  # fraction of steps recomputed on other peers to catch wrong results
    swarm_key: str | Path | None = None  # secret file of a private swarm (swarm/auth.py)
    min_quant: str | None = None  # route only through peers at least this precise ("int8": int8 or none); None: any

    def __post_init__(self) -> None:
        if not self.stall_probe_s > 0:
            raise ValueError(f"stall_probe_s={self.stall_probe_s!r}: give the seconds after which a silent hop is probed (> 0)")
        if not 0 < self.stall_probe_min_s <= self.stall_probe_s:
            raise ValueError(f"stall_probe_min_s={self.stall_probe_min_s!r}: give the shortest wait before a timed "
                             f"hop is probed, in (0, stall_probe_s={self.stall_probe_s!r}]")
        if self.min_quant is not None and self.min_quant not in QUANT_PRECISION:
            raise ValueError(f"min_quant={self.min_quant!r}: choose one of {', '.join(QUANT_PRECISION)} (or None for any)")

    def accepts_quant(self, quant: str) -> bool:
        """Whether a peer announcing `quant` is precise enough (unknown kinds are not, when a minimum is set)."""
        if self.min_quant is None:
            return True
        return quant in QUANT_PRECISION and QUANT_PRECISION.index(quant) >= QUANT_PRECISION.index(self.min_quant)
