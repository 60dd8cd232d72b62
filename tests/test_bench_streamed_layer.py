"""benchmarks/bench_streamed_layer.py runs anywhere: on the CPU its streamed path (weights copied in
for every step) must give the resident path's output, which the script checks before timing."""

import json

import pytest

from benchmarks.bench_streamed_layer import main

SHAPE = ["--hidden", "64", "--intermediate", "128", "--kv-dim", "16", "--batches", "1,8", "--steps", "2"]
COLUMNS = 64 + 16 + 16 + 64 + 128 + 128 + 64  # output columns of q, k, v, o, gate, up, down
ELEMENTS = 64 * 64 * 2 + 64 * 16 * 2 + 64 * 128 * 3


@pytest.mark.parametrize(("weights", "layer_bytes"), [("bf16", 4 * ELEMENTS), ("int8", ELEMENTS + 4 * COLUMNS)])
def test_the_streamed_layer_benchmark_matches_the_resident_layer_and_writes_its_table(tmp_path, monkeypatch,
                                                                                      weights, layer_bytes):
    monkeypatch.setenv("OUT", str(tmp_path))
    rows = main([*SHAPE, "--weights", weights])
    assert [r.batch for r in rows] == [1, 8]
    assert all(r.streamed_ms > 0 and r.resident_ms > 0 for r in rows)
    written = json.loads((tmp_path / f"bench_streamed_layer_{weights}.json").read_text())
    assert written["layer_bytes"] == layer_bytes  # float32 on the CPU; int8 keeps a float32 scale per column
    assert [r["batch"] for r in written["rows"]] == [1, 8]
