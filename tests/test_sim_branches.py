"""sim_branches: a running simulator forked into branches under other rules, each paired with the run itself."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sim_branches import BranchSpec, branch_trace_path, manifest_path, summarise
from benchmarks.sim_trace import TracePoint, read_trace, window_mean

ROOT = Path(__file__).resolve().parent.parent
# 60 peers at 2x, 60%/h churn (half of it abrupt), 30% standbys: several crashes in every 5-min window.
RUN = ["--peers", "60", "--hours", "0.25", "--warmup-hours", "0.25", "--churn", "0.6", "--redundancy", "2",
       "--graceful", "0.5", "--standby-share", "0.3", "--route-period", "600", "--seed", "3",
       "--react-first-step"]  # calibrated on the rule before the forty-fourth session
# "same" sets a constant to its own value: the trunk's run, window by window. "blind": crashes seen after 20 s
# instead of 1.5, "slow": moves loading at 5 s a layer; both change what crashes cost.
BRANCHES = ["same:CRASH_PUSH_S=1.0", "blind:CRASH_SEEN_S=20", "slow:move_load_s_per_layer=5,thin=false"]
EVERY_S, HORIZON_S, START_S, END_S = 300.0, 300.0, 900.0, 1800.0


def simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.simulate_swarm", *RUN, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def branched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The trace of a branched run and of the same run without branches."""
    folder = tmp_path_factory.mktemp("branches")
    trunk, plain = folder / "trunk.trace", folder / "plain.trace"
    args = [f"--branch={b}" for b in BRANCHES]
    done = simulate("--trace", str(trunk), "--json", str(folder / "trunk.json"), "--branch-every", str(EVERY_S),
                    "--branch-horizon", str(HORIZON_S), *args)
    assert done.returncode == 0, done.stderr
    done = simulate("--trace", str(plain), "--json", str(folder / "plain.json"))
    assert done.returncode == 0, done.stderr
    return trunk, plain


def test_the_trunk_is_the_run_without_branches(branched: tuple[Path, Path]) -> None:
    trunk, plain = branched
    assert trunk.read_bytes() == plain.read_bytes()
    assert json.loads(trunk.with_suffix(".json").read_text())["migrations"] == \
        json.loads(plain.with_suffix(".json").read_text())["migrations"]


def test_windows_start_every_period_of_the_measured_hours_and_fit_in_them(branched: tuple[Path, Path]) -> None:
    manifest = json.loads(manifest_path(branched[0]).read_text())
    windows = manifest["windows"]
    assert len(windows) == 3 and windows[0] == START_S  # 900, 1200, 1500: the last one ends at the run's end
    assert all(b - a >= EVERY_S for a, b in zip(windows, windows[1:])) and windows[-1] + HORIZON_S <= END_S
    assert manifest["branches"] == ["same", "blind", "slow"]
    for w, start in enumerate(windows):
        for name in manifest["branches"]:
            points = read_trace(branch_trace_path(branched[0], w, name))
            assert points[0].t == start and points[-1].t == start + HORIZON_S and points[-1].cause == "end"


def test_a_branch_under_the_same_rules_is_the_trunk_window_by_window(branched: tuple[Path, Path]) -> None:
    trunk = read_trace(branched[0])
    windows = json.loads(manifest_path(branched[0]).read_text())["windows"]
    for w, start in enumerate(windows):
        same = read_trace(branch_trace_path(branched[0], w, "same"))
        inside = [(p.t, p.flow, p.cause, p.detail) for p in trunk if start < p.t < start + HORIZON_S]
        assert [(p.t, p.flow, p.cause, p.detail) for p in same[1:-1]] == inside
        assert window_mean(same, start, start + HORIZON_S) == window_mean(trunk, start, start + HORIZON_S)


def test_the_report_pairs_each_branch_with_the_trunk(branched: tuple[Path, Path]) -> None:
    trunk = read_trace(branched[0])
    windows = json.loads(manifest_path(branched[0]).read_text())["windows"]
    report = summarise([branched[0]])
    by_name = {b.name: b for b in report.branches}
    assert report.horizon_s == HORIZON_S and set(by_name) == {"same", "blind", "slow"}
    assert by_name["same"].difference == 0 and by_name["same"].better_on == by_name["same"].worse_on == 0
    for name in ("blind", "slow"):
        diffs = [100 * (window_mean(read_trace(branch_trace_path(branched[0], w, name)), s, s + HORIZON_S)
                        - window_mean(trunk, s, s + HORIZON_S)) for w, s in enumerate(windows)]
        summary = by_name[name]
        assert summary.difference == pytest.approx(statistics.fmean(diffs))
        assert summary.sd == pytest.approx(statistics.stdev(diffs))
        assert summary.median == pytest.approx(statistics.median(diffs))
        assert summary.better_on == sum(d > 0 for d in diffs) and summary.worse_on == sum(d < 0 for d in diffs)
    # Crashes seen 20 s late leave their layers dark longer: worse on the whole (a window may still come out
    # better: from the first decision that differs the branch's swarm goes its own way).
    assert by_name["blind"].difference < 0 and by_name["blind"].worse_on >= 1
    assert by_name["slow"].overrides == {"move_load_s_per_layer": "5", "thin": "false"}
    # Windows that tile the measured time: the differences over the run are their mean.
    assert by_name["slow"].over_the_run == pytest.approx(by_name["slow"].difference)
    # Two runs pool their windows.
    assert summarise([branched[0], branched[0]]).branches[1].windows == 2 * len(windows)


def test_branches_at_crashes_start_as_each_serving_peer_crashes(tmp_path: Path) -> None:
    trace = tmp_path / "crashes.trace"
    done = simulate("--trace", str(trace), "--json", str(tmp_path / "crashes.json"), "--branch-at-crashes",
                    "--branch-horizon", "60", "--branch", "same:MOVE_CONFIRM_S=1.0", "--branch", "blind:CRASH_SEEN_S=20")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(manifest_path(trace).read_text())
    trunk = read_trace(trace)
    # A crash that takes flow is a point of the trace at the crash's time, its flow below the point before.
    dropped = [p.t for before, p in zip(trunk, trunk[1:]) if p.cause == "crash" and p.flow < before.flow]
    inside = [t for t in dropped if START_S <= t <= END_S - 60]
    assert manifest["windows_at"] == "crashes" and len(inside) >= 3
    assert set(inside) <= set(manifest["windows"]) <= {p.t for p in trunk if p.cause == "crash"}
    report = {b.name: b for b in summarise([trace]).branches}
    assert report["same"].difference == 0 and report["same"].windows == len(manifest["windows"])
    assert report["blind"].difference < 0  # nobody reacts to those crashes for 20 s
    blind = report["blind"]  # over the run: the windows' differences summed, over the measured time
    assert blind.over_the_run == pytest.approx(blind.difference * blind.windows * 60 / (END_S - START_S))


def test_the_cli_prints_the_table(branched: tuple[Path, Path]) -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.sim_branches", str(branched[0])],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert "| blind | CRASH_SEEN_S=20 | 3 |" in done.stdout
    done = subprocess.run([sys.executable, "-m", "benchmarks.sim_branches", str(branched[1])],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--branch-every" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["--branch", "x:CRASH_PUSH_S=0.5"], "add --trace FILE"),
    (["--trace", "T", "--branch", "x:CRASH_PUSH_S"], "KEY=VALUE"),
    (["--trace", "T", "--branch", "x:peers=5"], "read only when the run starts"),
    (["--trace", "T", "--branch", "x:NO_SUCH=1"], "neither a SimConfig field"),
    (["--trace", "T", "--branch", "x:thin=maybe"], "true or false"),
    (["--trace", "T", "--branch", "x:A=1", "--branch", "x:B=1"], "neither"),
    (["--trace", "T", "--branch", "x:CRASH_PUSH_S=1", "--branch", "x:MOVE_CONFIRM_S=1"], "share a name"),
    (["--trace", "T", "--branch", "x:CRASH_PUSH_S=1", "--branch-every", "0"], "> 0"),
])
def test_a_bad_branch_is_one_line_before_the_run(args: list[str], says: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.simulate_swarm", *RUN,
                           *[str(tmp_path / a) if a == "T" else a for a in args]],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr


def test_a_spec_without_a_name_is_named_by_its_overrides() -> None:
    assert BranchSpec.parse("CRASH_PUSH_S=0.5") == BranchSpec("CRASH_PUSH_S=0.5", (("CRASH_PUSH_S", "0.5"),))
    assert BranchSpec.parse("a:X=1, Y=2").overrides == (("X", "1"), ("Y", "2"))


def test_a_window_mean_is_the_exact_mean_of_the_step_function() -> None:
    points = [TracePoint(0.0, 1.0, "other", "", 0), TracePoint(10.0, 0.0, "crash", "", -1),
              TracePoint(15.0, 0.5, "layer", "", 3), TracePoint(20.0, 0.5, "end", "", 3)]
    assert window_mean(points, 0.0, 20.0) == pytest.approx((10 + 0 + 2.5) / 20)
    assert window_mean(points, 5.0, 12.0) == pytest.approx(5 / 7)
    assert window_mean(points, 18.0, 30.0) == pytest.approx(0.5)  # the last point holds past the trace's end
    with pytest.raises(ValueError, match="starts after"):
        window_mean(points[1:], 5.0, 12.0)
    with pytest.raises(ValueError, match="empty"):
        window_mean(points, 5.0, 5.0)
