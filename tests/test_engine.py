"""`ServingEngine` on the CPU: the one run_batch, copy-on-write pages, the start-up measurement.

The CUDA-graph path of the same engine is tested on a GPU in tests/test_gpu_serving.py.
"""

from __future__ import annotations

import pytest
import torch

from peer.engine import ServingEngine
from shards.batch import BatchLayout
from shards.shard import Shard


def test_run_batch_is_the_shard_forward_with_its_own_cache(tiny_model) -> None:
    shard = Shard.from_pretrained(tiny_model, 0, 4)
    engine = ServingEngine(shard, num_pages=8, page_size=4, max_length=32)
    assert engine.graphs is None  # CPU: eager only
    cache = shard.new_cache(8, 4)
    gen = torch.Generator().manual_seed(0)
    prefill = BatchLayout([5, 3], [0, 0], [[0, 1], [2]], 4)
    x = torch.randn(8, 64, generator=gen)
    assert torch.equal(engine.run_batch(x, prefill, (0, 4), True), shard.forward(x, prefill, cache))
    decode = BatchLayout.decode([5, 3], [[0, 1], [2, 3]], 4)
    y = torch.randn(2, 64, generator=gen)
    assert torch.equal(engine.run_batch(y, decode, (0, 4), True), shard.forward(y, decode, cache))
    stateless = BatchLayout([3], [0], None, 4)
    z = torch.randn(3, 64, generator=gen)
    assert torch.equal(engine.run_batch(z, stateless, (1, 3), False), shard.forward(z, stateless, None, layers=(1, 3)))
    assert engine.steps == {"eager": 3}


def test_copy_page_copies_every_layer_and_the_stored_outputs(tiny_model) -> None:
    engine = ServingEngine(Shard.from_pretrained(tiny_model, 1, 3), num_pages=4, page_size=4, max_length=16)
    for k, v in zip(engine.cache.k, engine.cache.v):
        k[1].normal_()
        v[1].normal_()
    engine.page_outputs.write([1], 0, torch.randn(4, 64))
    engine.copy_page(1, 3)
    for k, v in zip(engine.cache.k, engine.cache.v):
        assert torch.equal(k[3], k[1]) and torch.equal(v[3], v[1])
    assert torch.equal(engine.page_outputs.read([3]), engine.page_outputs.read([1]))


def test_throughput_is_measured_on_the_serving_path(tiny_model) -> None:
    engine = ServingEngine(Shard.from_pretrained(tiny_model, 0, 4), num_pages=16, page_size=4, max_length=64)
    assert engine.measure_throughput() > 0
    assert not engine.steps  # the measurement is not counted as served batches
    tiny_pool = ServingEngine(Shard.from_pretrained(tiny_model, 0, 4), num_pages=4, page_size=4, max_length=16)
    assert tiny_pool.measure_throughput() > 0  # a shorter context that fits the pool
    too_small = ServingEngine(Shard.from_pretrained(tiny_model, 0, 4), num_pages=2, page_size=4, max_length=8)
    assert too_small.measure_throughput() == 0.0


def test_a_measurement_on_given_pages_leaves_every_other_page_and_the_counters_alone(tiny_model) -> None:
    """A growing join measures its graphs while sessions hold pages (peer/server.py _graph_throughput)."""
    engine = ServingEngine(Shard.from_pretrained(tiny_model, 0, 4), num_pages=24, page_size=4, max_length=64)
    needed = engine.measure_pages()
    assert needed == -(-(32 + 8 + 1) // 4)  # THROUGHPUT_CONTEXT tokens, 8 decode steps and one more
    prefill = BatchLayout([8], [0], [[0, 1]], 4)  # a session's pages 0 and 1
    engine.run_batch(torch.randn(8, 64), prefill, (0, 4), True)
    held = [(k[:2].clone(), v[:2].clone()) for k, v in zip(engine.cache.k, engine.cache.v)]
    assert engine.measure_throughput(pages=range(2, 2 + needed)) > 0
    assert all(torch.equal(k[:2], hk) and torch.equal(v[:2], hv)
               for (k, v), (hk, hv) in zip(zip(engine.cache.k, engine.cache.v), held))
    assert engine.steps == {"eager": 1}  # the session's batch, not the measurement's
    with pytest.raises(ValueError, match="cache pages"):
        engine.measure_throughput(pages=[2, 3])


def test_no_prefix_sharing_with_length_dependent_rope(tiny_model_factory) -> None:
    """Dynamic NTK RoPE (the tiny mixtral) rotates a prefix by the length it had when computed."""
    dynamic = ServingEngine(Shard.from_pretrained(tiny_model_factory("mixtral"), 0, 2), num_pages=8, page_size=4,
                            max_length=32)
    assert dynamic.page_outputs is None  # the handler then serves every step without shared pages
    dynamic.copy_page(1, 2)  # copy-on-write still copies the KV
    plain = ServingEngine(Shard.from_pretrained(tiny_model_factory("llama"), 0, 2), num_pages=8, page_size=4,
                          max_length=32)
    assert plain.page_outputs is not None
