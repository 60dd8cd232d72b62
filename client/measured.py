"""Throughput the client measured itself: a peer cannot buy traffic by announcing a speed it lacks.

A peer's record announces tokens per second through its whole layer range, and routing ranks
peers by it. A hostile peer can announce 1e6 and take every route (an eclipse). So the client
times each decode step it sends through a hop and keeps, per peer, a moving average of the
layer-tokens per second it saw (tokens x layers of the hop / seconds, network included). Once a
peer has been measured, routing uses what it measured (never more than the peer announces): a
liar drops to what it really delivers, and a far peer is costed with the network it sits behind.
Peers not measured yet keep their announced figure, so they get tried and measured in turn.
"""

from __future__ import annotations

from dataclasses import replace

from swarm.types import SwarmView

ALPHA = 0.3  # weight of the newest step: a few steps settle it, one slow step does not
MIN_SECONDS = 1e-5  # a step faster than this is a timer artefact, not a measurement


class MeasuredThroughput:
    """Per peer: an exponential moving average of measured layer-tokens per second."""

    def __init__(self) -> None:
        self._rate: dict[str, float] = {}

    def observe(self, peer_id: str, layers: int, tokens: int, seconds: float) -> None:
        """A decode step of `tokens` new tokens went through `layers` of the peer's layers in `seconds`."""
        if seconds < MIN_SECONDS or layers < 1 or tokens < 1:
            return
        rate = tokens * layers / seconds
        old = self._rate.get(peer_id)
        self._rate[peer_id] = rate if old is None else (1 - ALPHA) * old + ALPHA * rate

    def layer_tokens_per_second(self, peer_id: str) -> float | None:
        return self._rate.get(peer_id)

    def expected_seconds(self, peer_id: str, layers: int, tokens: int) -> float | None:
        """How long a decode step of `tokens` new tokens through `layers` of the peer's layers usually
        takes, network included (client/stall.py: how long a silence is unusual); None before a measure."""
        rate = self._rate.get(peer_id)
        return None if rate is None else tokens * layers / rate

    def apply(self, view: SwarmView) -> SwarmView:
        """The view with each measured peer's throughput lowered to what the client measured."""
        records = dict(view.records)
        for peer_id, rate in self._rate.items():
            record = records.get(peer_id)
            if record is not None and len(record.layers) > 0:
                measured = rate / len(record.layers)  # tokens/s through its whole range
                if measured < record.throughput:
                    records[peer_id] = replace(record, throughput=measured)
        return replace(view, records=records)
