"""Every benchmark script answers --help: its options parse (a duplicated option would make it fail
before measuring anything, on a GPU lease that cannot be had back)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if "argparse" in p.read_text())


def test_every_benchmark_script_answers_help() -> None:
    assert len(SCRIPTS) > 10
    failed = {}
    for i in range(0, len(SCRIPTS), 4):  # four at a time: each imports torch
        batch = SCRIPTS[i : i + 4]
        procs = {name: subprocess.Popen([sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for name in batch}
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0 or "usage:" not in out:
                failed[name] = out[-400:]
    assert not failed, failed
