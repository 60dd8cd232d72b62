"""sim_seeds: several traced simulator runs summarised together, and paired against others."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sim_dips import analyse
from benchmarks.sim_seeds import summarise, summarise_run
from benchmarks.sim_trace import read_trace

ROOT = Path(__file__).resolve().parent.parent
# 60 peers at 2x, 30%/h churn (half of it abrupt), 30% standbys: crashes within the half hour measured.
RUN = ["--peers", "60", "--hours", "0.5", "--warmup-hours", "0.25", "--churn", "0.3", "--redundancy", "2",
       "--graceful", "0.5", "--standby-share", "0.3", "--route-period", "600"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three seeds of the simulator's CLI, each written as STEM.json and STEM.trace."""
    folder = tmp_path_factory.mktemp("seeds")
    stems = []
    for seed in (0, 1, 2):
        stem = folder / f"run_s{seed}"
        subprocess.run([sys.executable, "-m", "benchmarks.simulate_swarm", *RUN, "--seed", str(seed),
                        "--json", f"{stem}.json", "--trace", f"{stem}.trace"],
                       cwd=ROOT, check=True, capture_output=True, timeout=600)
        stems.append(stem)
    return stems


def test_each_run_reads_its_trace_and_its_bracket_of_the_optimum(runs: list[Path]) -> None:
    for stem in runs:
        run = summarise_run(stem)
        dips = analyse(read_trace(Path(f"{stem}.trace")))
        result = json.loads(Path(f"{stem}.json").read_text())
        assert run.time_mean == pytest.approx(100 * dips.mean) and 0 < run.time_mean <= 100
        assert run.optimum_share_low == pytest.approx(dips.mean / result["optimum_high_vs_bound"] * 100)
        assert run.optimum_share_high == pytest.approx(dips.mean / result["optimum_low_vs_bound"] * 100)
        assert run.optimum_share_low <= run.optimum_share_high
        assert run.crashes == pytest.approx(dips.lost_by_cause.get("crash", 0.0))
        assert run.moves_per_peer_hour == result["migrations_per_peer_hour"]


def test_the_mean_its_spread_and_the_pairs_are_those_of_the_runs(runs: list[Path]) -> None:
    summaries = [summarise_run(stem) for stem in runs]
    means = [r.time_mean for r in summaries]
    assert len(set(means)) == 3  # three seeds, three populations
    report = summarise(summaries)
    assert report.time_mean.mean == pytest.approx(statistics.fmean(means))
    assert report.time_mean.sd == pytest.approx(statistics.stdev(means))
    assert report.time_mean.se == pytest.approx(statistics.stdev(means) / 3 ** 0.5)
    assert report.at_target_low <= report.at_target_high <= 3 and report.paired is None
    # Paired against the same seeds in another order: the differences are those of the runs.
    shifted = summarise(summaries, summaries[1:] + summaries[:1])
    differences = [a - b for a, b in zip(means, means[1:] + means[:1])]
    assert shifted.paired is not None
    assert shifted.paired.difference.mean == pytest.approx(statistics.fmean(differences), abs=1e-12)
    assert shifted.paired.better_on == sum(d > 0 for d in differences)
    itself = summarise(summaries, summaries)
    assert itself.paired is not None and itself.paired.difference.mean == 0 and itself.paired.better_on == 0


def test_the_cli_prints_the_table_writes_json_and_names_the_fix_for_a_missing_run(runs: list[Path], tmp_path: Path) -> None:
    out_json = tmp_path / "seeds.json"
    out = subprocess.run([sys.executable, "-m", "benchmarks.sim_seeds", *map(str, runs), "--against", *map(str, runs),
                          "--json", str(out_json)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "mean of 3" in out.stdout and "paired: +0.00" in out.stdout and "higher on 0 of 3" in out.stdout
    assert len(json.loads(out_json.read_text())["runs"]) == 3
    missing = subprocess.run([sys.executable, "-m", "benchmarks.sim_seeds", str(tmp_path / "none")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "simulate_swarm with --json" in missing.stderr
    assert "Traceback" not in missing.stderr
    unpaired = subprocess.run([sys.executable, "-m", "benchmarks.sim_seeds", *map(str, runs), "--against", str(runs[0])],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert unpaired.returncode != 0 and "one run per run" in unpaired.stderr and "Traceback" not in unpaired.stderr
