"""benchmarks/bench_streamed_layer.py runs anywhere: on the CPU its streamed path (weights copied in
for every step) must give the resident path's output, which the script checks before timing."""

import json

from benchmarks.bench_streamed_layer import main


def test_the_streamed_layer_benchmark_matches_the_resident_layer_and_writes_its_table(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    rows = main(["--hidden", "64", "--intermediate", "128", "--kv-dim", "16", "--batches", "1,8", "--steps", "2"])
    assert [r.batch for r in rows] == [1, 8]
    assert all(r.streamed_ms > 0 and r.resident_ms > 0 for r in rows)
    written = json.loads((tmp_path / "bench_streamed_layer.json").read_text())
    assert written["layer_bytes"] == 4 * (64 * 64 * 2 + 64 * 16 * 2 + 64 * 128 * 3)  # float32 on the CPU
    assert [r["batch"] for r in written["rows"]] == [1, 8]
