"""simulate_swarm --trace and sim_dips: the served max flow at every change, each drop put down to its event."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.sim_dips import analyse, format_report
from benchmarks.sim_trace import CAUSES, read_trace
from benchmarks.simulate_swarm import GPU_CLASSES, SimConfig, simulate

ROOT = Path(__file__).resolve().parent.parent
# 60 peers at 2x, 30%/h churn, half of it abrupt, 30% standbys, loads by layer from disk: crashes,
# drains, moves, joins and loaders all happen within the hour.
# Calibrated before the forty-third session: every reaction confirms its move (first_skips_confirm=False), and its
# first deciders wait one step (react_first_steps=1, the rule before the forty-fourth).
CASE = dict(peers=60, hours=1.0, warmup_hours=0.5, seed=1, churn=0.3, redundancy=2.0, graceful=0.5,
            standby_share=0.3, move_load_s_per_layer=2.0, prefetch_s=1200, standby_by_layer=True, serve_by_layer=True,
            first_skips_confirm=False, react_first_steps=1)


def test_the_trace_is_the_flow_the_simulator_samples_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    # Route samples every 2 s: their mean is the trace's time mean up to the dips shorter than a sample.
    traced = simulate(SimConfig(**CASE, route_period_s=2.0, trace=str(path)))
    plain = simulate(SimConfig(**CASE, route_period_s=2.0))
    assert traced.series == plain.series and traced.migrations == plain.migrations  # tracing perturbs nothing
    points = read_trace(path)
    assert len(points) > 100
    assert points[0].t == 0.5 * 3600 and points[-1].t == 1.5 * 3600 and points[-1].cause == "end"
    assert all(a.t <= b.t for a, b in zip(points, points[1:]))
    assert all(p.cause in CAUSES or p.cause == "end" for p in points)
    report = analyse(points)
    assert abs(report.mean - traced.flow_vs_bound_mean) < 0.003, (report.mean, traced.flow_vs_bound_mean)


def test_every_drop_of_the_flow_is_put_down_to_a_named_event(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    r = simulate(SimConfig(**CASE, route_period_s=600.0, trace=str(path)))
    report = analyse(read_trace(path))
    assert r.departures > 5
    assert "other" not in report.drops_by_cause, report.drops_by_cause
    assert report.drops_by_cause.get("crash", 0) > 0 and report.lost_by_cause.get("crash", 0.0) > 0
    assert report.median >= report.mean  # dips pull the mean below the usual level
    # Each crash names its peer's size and when it was seen; the crash points split by size add up, and the
    # part before the crash was seen is a share of them (a 1.5- or 6.5-s watch against dips of many seconds).
    crashes = [p for p in read_trace(path) if p.cause == "crash"]
    assert crashes and all(" seen " in p.detail for p in crashes)
    assert set(report.crash_lost_by_size) <= {k for k, _, _ in GPU_CLASSES}, report.crash_lost_by_size
    assert abs(sum(report.crash_lost_by_size.values()) - report.lost_by_cause["crash"]) < 1e-9
    assert report.crash_lost_unseen is not None and 0 < report.crash_lost_unseen < report.lost_by_cause["crash"]
    text = format_report(report)
    assert "below the median" in text and "crash" in text and "before the crash was seen" in text


def test_the_trace_marks_every_coverage_gap(tmp_path: Path) -> None:
    """Lines with "uncovered" are the time some layer had no server at all, standbys included: summed, the
    run's uncovered time, so a gap can be traced to the events around it."""
    path = tmp_path / "trace.jsonl"
    # Seed 3, every departure a crash: one 15-s gap that the standbys did not cover.
    r = simulate(SimConfig(**dict(CASE, graceful=0.0, seed=3), route_period_s=600.0, trace=str(path)))
    points = read_trace(path)
    gap_time = sum(b.t - a.t for a, b in zip(points, points[1:]) if a.uncovered)
    assert r.gaps_opened >= 1 and gap_time > 0
    assert abs(gap_time - (1 - r.coverage_time_fraction) * 3600) < 1e-6 * 3600, (gap_time, r.coverage_time_fraction)
    assert all(p.flow == 0 for p in points if p.uncovered)  # a layer nobody serves: no GPU peer either


def test_sim_dips_names_the_fix_for_a_missing_trace(tmp_path: Path) -> None:
    missing = tmp_path / "none.jsonl"
    out = subprocess.run([sys.executable, "-m", "benchmarks.sim_dips", str(missing)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "simulate_swarm --trace" in out.stderr and "Traceback" not in out.stderr
