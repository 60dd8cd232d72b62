"""Several traced simulator runs side by side: each run's exact time mean, its share of the optimum, what its
crashes took, and the mean over the runs with its spread; with --against, the paired differences.

At 2,000 peers one run's time mean spreads by about a point (sd) from seed to seed, mostly with what its
crashes happen to take (docs/balancing.md, forty-second session), so a rule is judged on several seeds,
paired where the runs share their populations (the same seed: the same arrivals, departures and sizes).
Each RUN is the stem of a `simulate_swarm ... --json RUN.json --trace RUN.trace` run; the time means are
the traces' exact ones (benchmarks/sim_dips.py), the share of the optimum divides them by the run's bracket
of the optimum (`optimum_high_vs_bound` gives the low end, `optimum_low_vs_bound` the high end).

    .venv/bin/python -m benchmarks.sim_seeds /tmp/new_s0 /tmp/new_s1 /tmp/new_s2 [--against /tmp/old_s0 ...]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.sim_dips import analyse
from benchmarks.sim_trace import read_trace

# The target for a public swarm at 2x: the time mean at least this share of the optimum (%).
TARGET_SHARE = 85.0


@dataclass(frozen=True)
class RunSummary:
    """One traced run; every figure in % (of sum(c) / L, or of the optimum) but the moves."""

    run: str
    time_mean: float  # exact, from the trace
    median: float  # the trace's time median: the level between events
    optimum_share_low: float  # time mean / the optimum's upper bound
    optimum_share_high: float  # time mean / the best placement found (the optimum's lower bound)
    crashes: float  # points of the time mean the crashes took below the median
    time_at_zero: float  # share of the time some layer had no GPU server
    moves_per_peer_hour: float
    coverage: float  # share of the time every layer had a server


@dataclass(frozen=True)
class Spread:
    """Mean, standard deviation and standard error of the mean of n values (sd and se 0 for one value)."""

    n: int
    mean: float
    sd: float
    se: float

    @staticmethod
    def of(values: list[float]) -> Spread:
        if not values:
            raise ValueError("no runs to summarise")
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return Spread(len(values), statistics.fmean(values), sd, sd / math.sqrt(len(values)))


@dataclass(frozen=True)
class Paired:
    """Time means of the runs minus those of the runs they are paired with, in points."""

    difference: Spread
    better_on: int  # runs whose time mean is higher than their pair's


@dataclass(frozen=True)
class SeedsReport:
    runs: list[RunSummary]
    time_mean: Spread
    optimum_share_low: Spread
    optimum_share_high: Spread
    at_target_low: int  # runs at TARGET_SHARE or more at the optimum's low end ...
    at_target_high: int  # ... and at its high end
    crashes: Spread
    most_moves_per_peer_hour: float
    paired: Paired | None


def summarise_run(stem: Path) -> RunSummary:
    """The summary of the run written to STEM.json and STEM.trace (SystemExit naming the fix if one is missing)."""
    result_file, trace_file = stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".trace")
    for path, flag in ((result_file, "--json"), (trace_file, "--trace")):
        if not path.is_file():
            raise SystemExit(f"{path}: not found; run simulate_swarm with {flag} {path}")
    result = json.loads(result_file.read_text())
    dips = analyse(read_trace(trace_file))
    mean = 100 * dips.mean
    return RunSummary(
        run=stem.name,
        time_mean=mean,
        median=100 * dips.median,
        optimum_share_low=mean / result["optimum_high_vs_bound"],  # both % of sum(c) / L over a share of it: %
        optimum_share_high=mean / result["optimum_low_vs_bound"],
        crashes=dips.lost_by_cause.get("crash", 0.0),
        time_at_zero=100 * dips.dark_share,
        moves_per_peer_hour=result["migrations_per_peer_hour"],
        coverage=100 * result["coverage_time_fraction"],
    )


def summarise(runs: list[RunSummary], against: list[RunSummary] | None = None) -> SeedsReport:
    """The runs together; `against` (as many runs, in the same order): the paired differences."""
    paired = None
    if against is not None:
        if len(against) != len(runs):
            raise ValueError(f"--against needs one run per run: {len(runs)} runs, {len(against)} to pair with")
        differences = [r.time_mean - a.time_mean for r, a in zip(runs, against)]
        paired = Paired(Spread.of(differences), sum(d > 0 for d in differences))
    return SeedsReport(
        runs=runs,
        time_mean=Spread.of([r.time_mean for r in runs]),
        optimum_share_low=Spread.of([r.optimum_share_low for r in runs]),
        optimum_share_high=Spread.of([r.optimum_share_high for r in runs]),
        at_target_low=sum(r.optimum_share_low >= TARGET_SHARE for r in runs),
        at_target_high=sum(r.optimum_share_high >= TARGET_SHARE for r in runs),
        crashes=Spread.of([r.crashes for r in runs]),
        most_moves_per_peer_hour=max(r.moves_per_peer_hour for r in runs),
        paired=paired,
    )


def format_report(report: SeedsReport) -> str:
    lines = ["run | time mean | median | share of the optimum | crashes (points) | time at 0 | moves / peer-h | coverage",
             "---|---|---|---|---|---|---|---"]
    for r in report.runs:
        lines.append(f"{r.run} | {r.time_mean:.2f} | {r.median:.1f} | {r.optimum_share_low:.1f}-{r.optimum_share_high:.1f}"
                     f" | {r.crashes:.2f} | {r.time_at_zero:.2f}% | {r.moves_per_peer_hour:.2f} | {r.coverage:.3f}%")
    t = report.time_mean
    lines.append(f"mean of {t.n} | {t.mean:.2f} (sd {t.sd:.2f}, se {t.se:.2f}) | | "
                 f"{report.optimum_share_low.mean:.2f}-{report.optimum_share_high.mean:.2f} | {report.crashes.mean:.2f} | | "
                 f"max {report.most_moves_per_peer_hour:.2f} |")
    lines.append(f"at {TARGET_SHARE:g}% of the optimum or more: {report.at_target_low} of {t.n} runs at the optimum's "
                 f"low end, {report.at_target_high} at its high end")
    if report.paired is not None:
        d = report.paired.difference
        lines.append(f"paired: {d.mean:+.2f} +- {d.se:.2f} points of the time mean (sd {d.sd:.2f}), "
                     f"higher on {report.paired.better_on} of {d.n}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path,
                    help="stems of simulate_swarm runs: each STEM was run with --json STEM.json --trace STEM.trace")
    ap.add_argument("--against", nargs="+", type=Path, default=None,
                    help="as many stems, in the same order (the same seeds under the rule before): print the paired differences")
    ap.add_argument("--json", type=Path, default=None, help="also write the report here as JSON")
    a = ap.parse_args()
    runs = [summarise_run(stem) for stem in a.runs]
    against = None if a.against is None else [summarise_run(stem) for stem in a.against]
    try:
        report = summarise(runs, against)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    print(format_report(report))
    if a.json is not None:
        a.json.write_text(json.dumps(asdict(report), indent=1))
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
