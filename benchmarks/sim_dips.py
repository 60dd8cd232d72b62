"""What a traced simulated swarm lost below its usual level, and to which events.

Reads a trace (`simulate_swarm --trace FILE`, benchmarks/sim_trace.py): the served max flow / capacity
bound at every change. The flow is a step function of time, so its time mean is exact (the route
samples only estimate it). The usual level is the time median; every second below it counts against
the event that last lowered the flow by more than DROP (a crash, a mover leaving its layers for its
reload, a drain's end), so a dip and the slow climb out of it go to what opened it. Prints:
  * the time mean, median and share of time at 0 (some layer on standbys alone);
  * per cause, the points of the mean lost below the median and how many drops it made;
  * what crashes lost, by the crashed peer's size (its layer count), and the part of it before the crash
    was seen (the simulator's crash watch: 1.5 s for a dead process, 6.5 s for a vanished host), which
    no placement or refill rule can act on: only a shallower dip or a faster watch cuts it;
  * every dip that took away more than --deep of the flow: when, by what, how deep, how long until the
    flow first rose and until it was back to 95% of where it was.
and writes the same as JSON (--json). docs/balancing.md (twenty-sixth session) has the numbers.

    .venv/bin/python -m benchmarks.simulate_swarm ... --trace /tmp/trace.jsonl
    .venv/bin/python -m benchmarks.sim_dips /tmp/trace.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.sim_trace import TracePoint, read_trace

# A fall of the flow smaller than this (a share of the bound) is no drop of its own: traced max flows
# are exact to 0.1% (sim_trace.TRACE_TOLERANCE), and a loader's layer can move it that much either way.
DROP = 0.004
# A dip is deep when it takes this share of the flow away or more.
DEEP_SHARE = 0.3
# A dip is over when the flow is back to this share of where it was before it.
RECOVERED = 0.95


@dataclass(frozen=True)
class Dip:
    t: float
    cause: str
    detail: str
    before: float  # flow / bound just before
    lowest: float  # the lowest flow / bound until it recovered (or the trace ended)
    first_rise_s: float | None  # seconds until the flow first rose again
    recovered_s: float | None  # seconds until it was back to RECOVERED x before


@dataclass(frozen=True)
class DipReport:
    seconds: float
    mean: float
    median: float
    dark_share: float  # share of the time at 0: some layer had no GPU server
    lost_by_cause: dict[str, float]  # points of the mean (flow / bound x 100) below the median, per cause
    drops_by_cause: dict[str, int]
    crash_lost_by_size: dict[int, float]  # the "crash" points, by the crashed peer's layer count
    crash_lost_unseen: float | None  # of the "crash" points, those lost before the crash was seen (None: not traced)
    deep_share: float  # the dips listed took at least this share of the flow
    deep: list[Dip]


# A crash's trace detail (benchmarks/simulate_swarm.py): "peer000936 k=16 9936:9952 seen 6.5 s".
_SIZE = re.compile(r"k=(\d+)")
_SEEN = re.compile(r"seen ([0-9.]+) s")


def _crash_facts(detail: str) -> tuple[int, float | None]:
    """The crashed peer's layer count (0 if unnamed) and the seconds until the crash was seen (None in a
    trace written before the simulator named them)."""
    size, seen = _SIZE.search(detail), _SEEN.search(detail)
    return (int(size.group(1)) if size else 0), (float(seen.group(1)) if seen else None)


def _segments(points: list[TracePoint]) -> list[tuple[TracePoint, float]]:
    """Each point with how long its flow held (the closing point holds for 0 s)."""
    return [(p, nxt.t - p.t) for p, nxt in zip(points, points[1:])]


def analyse(points: list[TracePoint], deep_share: float = DEEP_SHARE) -> DipReport:
    """The report of a trace's points (module docstring); the dips listed take `deep_share` of the flow or more."""
    segments = _segments(points)
    total = sum(d for _, d in segments)
    if total <= 0:
        raise ValueError("the trace spans no time: run the simulator with --hours > 0 and --trace")
    mean = sum(p.flow * d for p, d in segments) / total
    held = 0.0
    median = 0.0
    for flow, d in sorted((p.flow, d) for p, d in segments):
        held += d
        if held >= total / 2:
            median = flow
            break
    lost: dict[str, float] = {}
    drops: dict[str, int] = {}
    by_size: dict[int, float] = {}
    unseen: float | None = 0.0
    blamed, size, seen_at = "other", 0, 0.0
    for i, (p, d) in enumerate(segments):
        if i and p.flow < segments[i - 1][0].flow - DROP:
            blamed = p.cause
            drops[blamed] = drops.get(blamed, 0) + 1
            if blamed == "crash":
                size, seen = _crash_facts(p.detail)
                if seen is None:
                    unseen = None
                else:
                    seen_at = p.t + seen
        if p.flow < median:
            below = (median - p.flow) * d
            lost[blamed] = lost.get(blamed, 0.0) + below
            if blamed == "crash":
                by_size[size] = by_size.get(size, 0.0) + below
                if unseen is not None:
                    unseen += (median - p.flow) * min(d, max(0.0, seen_at - p.t))
    lost_points = {c: 100 * v / total for c, v in sorted(lost.items(), key=lambda kv: -kv[1])}
    return DipReport(total, mean, median, sum(d for p, d in segments if p.flow <= 0) / total,
                     lost_points, drops, {k: 100 * v / total for k, v in sorted(by_size.items())},
                     None if unseen is None else 100 * unseen / total, deep_share, _deep_dips(points, deep_share))


def _deep_dips(points: list[TracePoint], deep_share: float) -> list[Dip]:
    dips = []
    for i in range(1, len(points)):
        before, p = points[i - 1].flow, points[i]
        if before <= 0 or p.flow > (1 - deep_share) * before:
            continue
        lowest, first_rise, recovered = p.flow, None, None
        for q in points[i + 1:]:
            if first_rise is None and q.flow > lowest + DROP:
                first_rise = q.t - p.t
            if q.flow >= RECOVERED * before:
                recovered = q.t - p.t
                break
            lowest = min(lowest, q.flow)
        dips.append(Dip(p.t, p.cause, p.detail, before, lowest, first_rise, recovered))
    return dips


def format_report(r: DipReport) -> str:
    lines = [f"traced {r.seconds:.0f} s: flow / bound mean {r.mean:.1%}, median {r.median:.1%}, "
             f"at 0 (a layer on standbys alone) {r.dark_share:.2%} of the time",
             f"below the median: {sum(r.lost_by_cause.values()):.2f} points of the mean",
             f"{'cause':14} {'points':>7} {'drops':>6}"]
    for cause, points in r.lost_by_cause.items():
        lines.append(f"{cause:14} {points:7.2f} {r.drops_by_cause.get(cause, 0):6d}")
    if r.crash_lost_by_size:
        sizes = ", ".join(f"{k} layers {v:.2f}" for k, v in r.crash_lost_by_size.items())
        unseen = "not traced" if r.crash_lost_unseen is None else f"{r.crash_lost_unseen:.2f}"
        lines.append(f"crashes by the crashed peer's size (points): {sizes}; before the crash was seen (no rule can "
                     f"act yet): {unseen}")
    lines.append(f"\n{len(r.deep)} dips that took {r.deep_share:.0%} of the flow or more:")
    lines.append(f"{'t (s)':>8} {'cause':13} {'before':>7} {'lowest':>7} {'first rise':>10} {'back to 95%':>11}  detail")
    for d in r.deep:
        rise = "-" if d.first_rise_s is None else f"{d.first_rise_s:.1f} s"
        back = "-" if d.recovered_s is None else f"{d.recovered_s:.1f} s"
        lines.append(f"{d.t:8.0f} {d.cause:13} {d.before:7.1%} {d.lowest:7.1%} {rise:>10} {back:>11}  {d.detail}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a JSONL trace written by simulate_swarm --trace")
    ap.add_argument("--deep", type=float, default=DEEP_SHARE, help="list the dips that take this share of the flow or more")
    ap.add_argument("--json", type=Path, default=None, help="also write the report here as JSON")
    a = ap.parse_args()
    if not a.trace.is_file():
        raise SystemExit(f"{a.trace}: no such trace; write one with simulate_swarm --trace {a.trace}")
    report = analyse(read_trace(a.trace), a.deep)
    print(format_report(report))
    if a.json is not None:
        a.json.write_text(json.dumps(asdict(report), indent=1))
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
