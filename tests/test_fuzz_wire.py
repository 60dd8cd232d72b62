"""Bounded runs of the coverage-guided wire fuzzer (tests/fuzz/fuzz_wire.py) from the kept corpus."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FUZZER = Path(__file__).parent / "fuzz" / "fuzz_wire.py"
CORPUS = Path(__file__).parent / "fuzz" / "corpus"


def test_wire_fuzzer_finds_no_crash(tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris is a dev dependency: pip install -e .[dev]")
    corpus = tmp_path / "corpus"  # libFuzzer adds inputs to its first folder: keep the repo's copy clean
    shutil.copytree(CORPUS, corpus)
    seeds = len(list(corpus.iterdir()))
    assert seeds >= 8, "the seed corpus is missing"
    result = subprocess.run(
        [sys.executable, str(FUZZER), str(corpus), "-runs=30000", "-max_total_time=120", "-rss_limit_mb=2048",
         f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, timeout=300,
    )
    tail = "\n".join(result.stderr.splitlines()[-20:])
    assert result.returncode == 0, f"fuzzer found a crash (input saved in {tmp_path}):\n{tail}"
    assert "Done 30000 runs" in result.stderr or "DONE" in result.stderr, tail
    assert len(list(corpus.iterdir())) > seeds, "the fuzzer explored nothing beyond the seeds"
