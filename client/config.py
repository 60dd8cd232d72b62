"""`ClientConfig`: how a client finds and uses the swarm; building one does no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ClientConfig:
    initial_peers: tuple[str, ...] = ()
    model_name: str | None = None  # name in the DHT; default: the checkpoint folder's name
    step_timeout: float = 30.0  # seconds for one hop to answer a step before we fail over
    connect_timeout: float = 15.0
    max_retries: int = 5  # failovers per step before giving up with an error
    retry_backoff: float = 0.5  # seconds, doubled after every failed attempt of one step
    push: bool = True  # peers pass decode steps straight on (faster in benchmarks/bench_client_modes.py)
    view_max_age: float = 5.0  # re-read the DHT when the cached view is older than this
    verify: float = 0.0  # fraction of steps recomputed on other peers to catch wrong results
    swarm_key: str | Path | None = None  # secret file of a private swarm (swarm/auth.py)
