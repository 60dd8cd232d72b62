"""Branches of one simulated swarm: from one moment, the same swarm under other rules for a while, paired.

Two runs of one seed under two rules share their population (arrivals, departures, sizes) but part at
their first differing decision; from there each has its own placement and each crash its own cost, so at
2,000 peers two rules differ by about 1.4 points (sd) a seed and half a point takes some thirty paired
hour-long runs (docs/balancing.md, forty-second session). A rule that acts within a minute of a crash
(who reacts when, how soon a crash is known, how fast a refill loads) can be judged far more finely:
`simulate_swarm --branch-at-crashes --branch-horizon H --branch SPEC ...` forks the running simulator at
every crash of a serving peer in its measured hours (or, with --branch-every S instead, every S seconds);
each branch sets its overrides and runs on for H seconds from that very state (the same swarm, the same
departures to come: they are drawn from the population's own stream), writing its own trace, while the run
itself (the trunk) waits, then goes on unchanged. The trunk's trace is the run's without branches, byte for
byte. This module's CLI pairs each branch's time mean with the trunk's over the same window. Windows of 60 s
at crashes keep the two swarms together through a crash's response (0.8-1.6 points sd a window at 2,000
peers); windows of minutes let them part, and a crash that darkens a layer in one and not the other moves a
window by points (docs/balancing.md, forty-third session). What branches cannot show is what a rule does to
the placement over hours: that still takes whole runs (benchmarks/sim_seeds.py).

A SPEC is `NAME:KEY=VALUE,KEY=VALUE` (or just the overrides, which then name it): KEY is a SimConfig field
read while the swarm runs (`move_load_s_per_layer=0.3`, `crash_push=false`) or one of the simulator's
upper-case constants (`CRASH_PUSH_S=0.5`, `MOVE_CONFIRM_S=0`).

    $Q ... --trace T.trace --branch-at-crashes --branch-horizon 60 --branch notices:CRASH_PUSH_S=0.5
    .venv/bin/python -m benchmarks.sim_branches T.trace [T2.trace ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.sim_trace import read_trace, window_mean

# SimConfig fields a branch may not override: read once when the run starts (the population, the model,
# the measured hours, the files), so an override would silently do nothing, or describe another run.
START_ONLY = frozenset({
    "peers", "hours", "seed", "churn", "redundancy", "layers", "warmup_hours", "start", "standby_share",
    "redundancy_aware", "guard_discount", "check_arrays", "snapshots", "trace",
    "branch_every_s", "branch_horizon_s", "branches", "branch_at_crashes",
})


@dataclass(frozen=True)
class BranchSpec:
    name: str
    overrides: tuple[tuple[str, str], ...]  # (KEY, VALUE) as written

    @staticmethod
    def parse(text: str) -> BranchSpec:
        """`NAME:KEY=VALUE,KEY=VALUE`, or the overrides alone (ValueError naming the form)."""
        name, sep, body = text.partition(":")
        if not sep:
            name, body = text, text
        pairs = []
        for item in body.split(","):
            key, eq, value = item.partition("=")
            if not eq or not key.strip() or not value.strip():
                raise ValueError(f"--branch {text!r}: each override is KEY=VALUE, as in notices:CRASH_PUSH_S=0.5")
            pairs.append((key.strip(), value.strip()))
        if not name.strip() or "/" in name:
            raise ValueError(f"--branch {text!r}: a name without '/' goes before the ':'")
        return BranchSpec(name.strip(), tuple(pairs))


def _convert(text: str, annotation: str, key: str) -> Any:
    """VALUE as the type a SimConfig field is annotated with ("float | None", "bool", ...)."""
    if "None" in annotation and text.lower() == "none":
        return None
    kind = annotation.split("|")[0].strip()
    if kind == "bool":
        if text.lower() not in ("true", "false"):
            raise ValueError(f"{key} is true or false, got {text!r}")
        return text.lower() == "true"
    if kind in ("int", "float"):
        try:
            return int(text) if kind == "int" else float(text)
        except ValueError:
            raise ValueError(f"{key} is a number, got {text!r}") from None
    return text


def apply_overrides(spec: BranchSpec, cfg: Any, module: ModuleType) -> None:
    """Set a branch's overrides on the running simulator's SimConfig `cfg` and constants (`module`)."""
    annotations = {f.name: str(f.type) for f in fields(cfg)}
    for key, text in spec.overrides:
        if key in annotations:
            if key in START_ONLY:
                raise ValueError(f"--branch {spec.name}: {key} is read only when the run starts; give it to the run")
            setattr(cfg, key, _convert(text, annotations[key], key))
        elif key.isupper() and isinstance(getattr(module, key, None), (int, float)):
            setattr(module, key, float(text) if isinstance(getattr(module, key), float) else int(text))
        else:
            raise ValueError(f"--branch {spec.name}: {key} is neither a SimConfig field nor a numeric constant "
                             f"of {module.__name__}")


def validate(specs: list[BranchSpec], cfg: Any, module: ModuleType) -> None:
    """Every override applied to copies, so that a bad spec fails before the run, not in its first branch."""
    for spec in specs:
        saved = {k: getattr(module, k) for k, _ in spec.overrides if k.isupper() and hasattr(module, k)}
        try:
            apply_overrides(spec, type(cfg)(**asdict(cfg)), module)
        finally:
            for key, value in saved.items():
                setattr(module, key, value)
    if len({s.name for s in specs}) != len(specs):
        raise ValueError("two --branch specs share a name")


def manifest_path(trace: Path) -> Path:
    return trace.with_name(trace.name + ".branches.json")


def branch_trace_path(trace: Path, window: int, name: str) -> Path:
    return trace.with_name(f"{trace.name}.w{window}.{name}")


class Brancher:
    """Forks the simulator at each window's start; `split` returns the spec in a branch, None in the trunk.

    Windows start every `every_s` of the measured hours, or (`at_crashes`) at every crash of a serving peer
    in them: a branch then starts as the crash happens, and its window holds what the rule does about that
    crash (and any other within the horizon), from a swarm that has not yet parted from the trunk's."""

    def __init__(self, trace: Path, every_s: float, horizon_s: float, specs: list[BranchSpec], first_s: float,
                 end_s: float, at_crashes: bool = False) -> None:
        self.trace, self.every_s, self.horizon_s, self.specs = trace, every_s, horizon_s, specs
        self.first_s, self.end_s, self.at_crashes = first_s, end_s, at_crashes
        self.next_at = first_s if first_s + horizon_s <= end_s and not at_crashes else math.inf
        self.windows: list[float] = []
        self.window = -1

    def crash_opens_window(self, now: float) -> bool:
        """With `at_crashes`: does a crash at `now` start a window (inside the measured hours, room for the horizon)?"""
        return self.at_crashes and self.first_s <= now and now + self.horizon_s <= self.end_s

    def split(self, now: float) -> BranchSpec | None:
        """Fork one process per spec at `now`. The trunk waits for them all (a failed branch is an error),
        records the window and returns None; each branch returns its spec and runs on alone."""
        self.window = len(self.windows)
        children = []
        for spec in self.specs:
            pid = os.fork()
            if pid == 0:
                self.next_at = math.inf
                return spec
            children.append((pid, spec))
        failed = [spec.name for pid, spec in children if os.waitpid(pid, 0)[1] != 0]
        if failed:
            raise RuntimeError(f"branch {', '.join(failed)} at {now:.0f} s failed (its traceback is above)")
        self.windows.append(round(now, 3))  # as the traces write their times (sim_trace.FlowTrace.write)
        nxt = now + self.every_s
        if not self.at_crashes:
            self.next_at = nxt if nxt + self.horizon_s <= self.end_s else math.inf
        manifest_path(self.trace).write_text(json.dumps({
            "horizon_s": self.horizon_s, "measured_s": self.end_s - self.first_s,
            "windows_at": "crashes" if self.at_crashes else f"every {self.every_s:g} s",
            "branches": [s.name for s in self.specs],
            "overrides": {s.name: dict(s.overrides) for s in self.specs}, "windows": self.windows}, indent=1))
        return None

    def trace_path(self, spec: BranchSpec) -> Path:
        return branch_trace_path(self.trace, self.window, spec.name)


@dataclass(frozen=True)
class BranchSummary:
    name: str
    overrides: dict[str, str]
    windows: int
    difference: float  # mean over the windows of the branch's time mean minus the trunk's, points of sum(c) / L
    sd: float
    se: float
    # The middle difference: a branch whose path parts from the trunk's can meet a crash that darkens a layer
    # where the trunk's did not, or the other way round, and one such window moves the mean by a point or more.
    median: float
    better_on: int  # windows where the branch's mean is higher
    worse_on: int
    trunk_mean: float  # the trunk's mean over those windows, % of sum(c) / L
    # The differences' sum over the measured hours, in points of their time mean: sum(difference x horizon) /
    # measured time, per run. Windows that tile the hours give `difference`; windows at crashes, what the rule
    # would do to the time mean through those crashes' windows (overlaps counted in each).
    over_the_run: float


@dataclass(frozen=True)
class BranchesReport:
    runs: list[str]
    horizon_s: float
    branches: list[BranchSummary]


def summarise(traces: list[Path]) -> BranchesReport:
    """Every branch paired with its trunk, window by window, pooled over the runs (the same specs in each)."""
    if not traces:
        raise ValueError("no runs given")
    diffs: dict[str, list[float]] = {}
    trunks: dict[str, list[float]] = {}
    overrides: dict[str, dict[str, str]] = {}
    horizon = None
    measured = 0.0
    for trace in traces:
        manifest = manifest_path(trace)
        if not trace.is_file() or not manifest.is_file():
            raise SystemExit(f"{trace}: no trace or no {manifest.name}; run simulate_swarm with --trace {trace} "
                             "--branch-every ... --branch ...")
        m = json.loads(manifest.read_text())
        if horizon is not None and m["horizon_s"] != horizon:
            raise SystemExit(f"{trace}: branches of {m['horizon_s']} s, the others' {horizon} s: pool like with like")
        horizon = m["horizon_s"]
        measured += m["measured_s"]
        trunk = read_trace(trace)
        for w, start in enumerate(m["windows"]):
            base = 100 * window_mean(trunk, start, start + horizon)
            for name in m["branches"]:
                overrides.setdefault(name, m["overrides"][name])
                branch = 100 * window_mean(read_trace(branch_trace_path(trace, w, name)), start, start + horizon)
                diffs.setdefault(name, []).append(branch - base)
                trunks.setdefault(name, []).append(base)
    summaries = []
    for name, values in diffs.items():
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        summaries.append(BranchSummary(name, overrides[name], len(values), statistics.fmean(values), sd,
                                       sd / math.sqrt(len(values)), statistics.median(values), sum(v > 0 for v in values),
                                       sum(v < 0 for v in values), statistics.fmean(trunks[name]),
                                       sum(values) * horizon / measured))
    return BranchesReport([str(t) for t in traces], float(horizon or 0.0), summaries)


def format_report(report: BranchesReport) -> str:
    lines = [f"{len(report.runs)} run(s), windows of {report.horizon_s:g} s; each branch's time mean minus the "
             "trunk's over the same window (points of sum(c) / L)",
             "| branch | overrides | windows | trunk mean | difference | sd | se | median | better / worse on | over the run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for b in report.branches:
        changes = ", ".join(f"{k}={v}" for k, v in b.overrides.items())
        lines.append(f"| {b.name} | {changes} | {b.windows} | {b.trunk_mean:.2f}% | {b.difference:+.2f} | {b.sd:.2f} "
                     f"| {b.se:.2f} | {b.median:+.2f} | {b.better_on} / {b.worse_on} | {b.over_the_run:+.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", type=Path, help="trunk traces of simulate_swarm runs with --branch ...")
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    a = ap.parse_args()
    report = summarise(a.traces)
    print(format_report(report))
    if a.json:
        a.json.write_text(json.dumps(asdict(report), indent=1))
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
