"""Where a simulated swarm's throughput goes: its max flow at every change, and the event that caused it.

`simulate_swarm --trace FILE` samples the served max flow once a route period; between samples a
crash's dip, a mover's reload or a loader's last layer go unseen, and a 60-s sample cannot tell how
long a dip lasted or what opened it. FlowTrace takes the serving placement's exact max flow (over the
capacity bound, as the samples) whenever what the GPU peers serve changes, and tags each value with
the event that changed it; `benchmarks/sim_dips.py` reads the file and splits the time below the
run's median by cause and lists the deep dips (docs/balancing.md, twenty-sixth session).

One JSON line per change: {"t": seconds, "flow": max flow / bound, "cause": kind, "detail": text,
"bottleneck": the first layer the greedy cannot feed just above that flow, or -1}, and "uncovered":
the count of layers nobody serves, standbys included (a coverage gap), on the lines where it is not 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from routing.flow import flow_and_bottleneck
from swarm.types import LayerRange

# The events a trace names (SimConfig.trace). A crash and a drain's end take a serving peer away (a
# loader leaving gracefully goes at once: "drained" too); a move takes the mover off its old layers for
# its reload (strength and flow moves at a balance check, or any move made reacting to a gap or thin
# layer); a joiner adds capacity to the bound that it serves only as its layers arrive ("layer", the
# last "online"). "other": anything else (a standby's, whose
# capacity the max flow does not count, changes nothing here); "end": the point closing the trace.
CAUSES = ("crash", "drained", "move_strength", "move_flow", "move_react", "join", "layer", "online", "other")
# Relative precision of each traced max flow: a trace takes thousands of them an hour at 1,000 peers,
# and 0.1% is well under the dips it is there to see.
TRACE_TOLERANCE = 1e-3


@dataclass
class TracePoint:
    t: float
    flow: float  # served max flow / capacity bound (0 while some layer has no GPU server)
    cause: str  # one of CAUSES: the event since the last point that changed what is served
    detail: str  # which peer and layers (a crash: "peer000936 k=16 9936:9952 seen 6.5 s", when the watch saw it)
    bottleneck: int  # routing.flow.bottleneck_layer of the served placement; -1 at 0 flow
    uncovered: int = 0  # layers no GPU peer nor standby serves: a coverage gap while not 0


class FlowTrace:
    """Collects TracePoints; the simulator calls `cause` at each event and `observe` before the next."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.points: list[TracePoint] = []
        self._cause, self._detail = "other", ""
        self._signature: tuple[float, ...] | None = None

    def cause(self, kind: str, detail: str = "") -> None:
        """The event being handled now is `kind` (CAUSES); a change seen next is put down to it."""
        if kind not in CAUSES:
            raise ValueError(f"unknown trace cause {kind!r}; one of {', '.join(CAUSES)}")
        self._cause, self._detail = kind, detail

    def observe(self, now: float, signature: tuple[float, ...], dark: bool,
                served: Callable[[], list[tuple[LayerRange, float]]], num_layers: int,
                bound: Callable[[], float], uncovered: int = 0) -> None:
        """Add a point if what is served changed since the last one. `signature` is a cheap summary of it
        (the simulator's: the summed per-layer throughput, the count of layers no GPU peer serves and of
        peers, whose capacity is the bound), so
        the placement (`served`) and the capacity bound are built only then; `dark`: some layer has no
        GPU server (the flow is 0); `uncovered`: how many layers nobody serves, standbys included (the
        signature must change with it)."""
        if signature == self._signature:
            return
        self._signature = signature
        placement = [] if dark else served()
        flow, bottleneck = flow_and_bottleneck(placement, num_layers, TRACE_TOLERANCE) if placement else (0.0, None)
        capacity = bound()
        cause = self._cause if self.points else "other"  # the first point is where the trace starts
        self.points.append(TracePoint(now, flow / capacity if capacity else 0.0, cause, self._detail,
                                      -1 if bottleneck is None else bottleneck, uncovered))
        self._cause, self._detail = "other", ""

    def branch(self, now: float, path: Path) -> FlowTrace:
        """A trace for a branch of the run forked at `now` (benchmarks/sim_branches.py): it starts where this one
        stands, its last point's flow from `now` on, and writes to `path`."""
        other = FlowTrace(path)
        if self.points:
            last = self.points[-1]
            other.points.append(TracePoint(now, last.flow, "other", "the branch starts", last.bottleneck,
                                           last.uncovered))
        other._signature = self._signature
        return other

    def finish(self, end: float) -> None:
        """Close the trace at `end` (the last point's flow held until then) and write the file."""
        if self.points:
            last = self.points[-1]
            self.points.append(TracePoint(end, last.flow, "end", "", last.bottleneck, last.uncovered))
        self.write()

    def write(self) -> None:
        with self.path.open("w") as out:
            for p in self.points:
                line = {"t": round(p.t, 3), "flow": round(p.flow, 5), "cause": p.cause, "detail": p.detail,
                        "bottleneck": p.bottleneck}
                if p.uncovered:
                    line["uncovered"] = p.uncovered
                out.write(json.dumps(line) + "\n")


def window_mean(points: list[TracePoint], start: float, end: float) -> float:
    """The exact time mean of a trace's flow over [start, end] (a step function: each point holds until the next;
    the last one past the trace's end). ValueError if the trace starts after `start` or the window is empty."""
    if not end > start:
        raise ValueError(f"an empty window: [{start}, {end}]")
    if not points or points[0].t > start:
        raise ValueError(f"the trace starts after {start} s: it cannot say what was served then")
    total = 0.0
    for p, nxt in zip(points, [*points[1:], None]):
        held_from, held_to = max(p.t, start), min(end if nxt is None else nxt.t, end)
        if held_to > held_from:
            total += p.flow * (held_to - held_from)
    return total / (end - start)


def read_trace(path: Path) -> list[TracePoint]:
    """The points of a trace file, in time order."""
    points = []
    for line in path.read_text().splitlines():
        if line.strip():
            raw = json.loads(line)
            points.append(TracePoint(float(raw["t"]), float(raw["flow"]), str(raw["cause"]), str(raw["detail"]),
                                     int(raw["bottleneck"]), int(raw.get("uncovered", 0))))
    return points
