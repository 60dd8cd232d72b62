"""benchmarks/bench_streamed_standby.py runs anywhere: on the CPU its two engine processes (a host's
resident one and a standby's streamed one) load a tiny checkpoint, meet at the shared schedule and
time every phase; the figures themselves are the GPU's (docs/performance.md)."""

import json

import pytest

from benchmarks.bench_streamed_standby import main


def test_the_standby_benchmark_times_both_engines_alone_and_together(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    rows = main(["--checkpoint", str(tmp_path / "ck"), "--shape", "tiny", "--layers", "2", "--batches", "1,4",
                 "--seconds", "0.3"])
    assert [r.batch for r in rows] == [1, 4]
    for r in rows:
        assert min(r.host_ms_per_layer, r.host_ms_per_layer_beside, r.streamed_ms_per_layer,
                   r.streamed_ms_per_layer_beside) > 0
        assert r.stream_ratio == pytest.approx(r.host_ms_per_layer_beside / r.streamed_ms_per_layer_beside, rel=0.02)
    written = json.loads((tmp_path / "out" / "bench_streamed_standby_int8.json").read_text())
    assert written["meta"]["stream_quant"] == "int8" and len(written["rows"]) == 2
