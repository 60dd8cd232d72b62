"""Streamed weights (shards.streaming, `swarm-peer serve --stream-weights`) on the CPU.

On a CPU device the copies are plain, so a streamed shard must give exactly the resident one's
numbers: the slots, the functional call and the layer order are what is checked here. The CUDA
path (pinned host memory, a copy stream, real processes) is in tests/test_gpu_serving.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peer.engine import ServingEngine
from shards.batch import BatchLayout
from shards.quant import quantize_block, quantize_shard
from shards.shard import Shard
from swarm.types import LayerRange


def streamed(path: Path, start: int, end: int, quant: str = "none") -> Shard:
    shard = Shard.from_pretrained(path, start, end)
    quantize_shard(shard, quant)
    shard.stream_to("cpu")
    for layer in range(start, end):
        shard.stream_layer(layer)
    return shard


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_a_streamed_shard_computes_exactly_what_the_resident_one_does(tiny_model: Path, quant: str) -> None:
    resident = Shard.from_pretrained(tiny_model, 0, 4)
    quantize_shard(resident, quant)
    stream = streamed(tiny_model, 0, 4, quant)
    assert not stream.supports_fused_decode  # a captured graph would keep its slot's weights
    caches = resident.new_cache(8, 4), stream.new_cache(8, 4)
    gen = torch.Generator().manual_seed(0)
    prefill = BatchLayout([5, 3], [0, 0], [[0, 1], [2]], 4)
    decode = BatchLayout.decode([5, 3], [[0, 1], [2, 3]], 4)
    for layout, rows in ((prefill, 8), (decode, 2), (decode, 2)):
        x = torch.randn(rows, 64, generator=gen)
        assert torch.equal(resident.forward(x, layout, caches[0]), stream.forward(x, layout, caches[1]))
    for k_resident, k_streamed in zip(caches[0].k, caches[1].k):
        assert torch.equal(k_resident, k_streamed)
    stateless = BatchLayout([3], [0], None, 4)
    for span in ((1, 3), (2, 3), (0, 4)):  # sub-ranges stream only their own layers, in order
        z = torch.randn(3, 64, generator=gen)
        assert torch.equal(resident.forward(z, stateless, None, layers=span),
                           stream.forward(z, stateless, None, layers=span))


def test_two_slots_of_one_layer_each_hold_the_streamed_weights(tiny_model: Path) -> None:
    stream = streamed(tiny_model, 1, 4)
    layer_bytes = sum(p.numel() * p.element_size() for p in stream.blocks[0].parameters())
    assert stream.streamer is not None
    assert len(stream.streamer.slots) == 2 and stream.streamer.slot_bytes == 2 * layer_bytes
    assert sorted(stream.streamer.host) == [0, 1, 2]
    # The blocks keep their weights in host memory: nothing but the slots is on the device.
    assert all(p.device.type == "cpu" for p in stream.blocks.parameters())


def test_layers_of_different_shapes_cannot_share_the_slots(tiny_model: Path) -> None:
    shard = Shard.from_pretrained(tiny_model, 0, 2)
    quantize_block(shard.blocks[1], "int8")  # layer 1 now holds int8 tensors, layer 0 float32 ones
    with pytest.raises(ValueError, match="stream_layer comes after stream_to"):
        shard.stream_layer(0)
    shard.stream_to("cpu")
    shard.stream_layer(0)
    with pytest.raises(ValueError, match="without --stream-weights"):
        shard.stream_layer(1)
    with pytest.raises(ValueError, match="loaded on the CPU"):
        shard.stream_to("cpu")  # once


@pytest.mark.parametrize("growing", [False, True])
def test_the_engine_serves_streamed_weights_as_loaded_or_as_each_layer_arrives(tiny_model: Path,
                                                                               growing: bool) -> None:
    order = [2, 1, 3, 0] if growing else None
    grown: list[tuple[int, int]] = []
    engine = ServingEngine.load(str(tiny_model), LayerRange(0, 4),
                                dtype=torch.float32, device="cpu", quant="int8", quant_group_size=128, num_pages=8,
                                page_size=4, max_length=32, order=order, stream_weights=True,
                                on_grow=(lambda e, served: grown.append((served.start, served.end))) if growing else None)
    assert engine.shard.streamer is not None and sorted(engine.shard.streamer.host) == [0, 1, 2, 3]
    if growing:
        assert grown == [(2, 3), (1, 3), (1, 4), (0, 4)]
    resident = Shard.from_pretrained(tiny_model, 0, 4)
    quantize_shard(resident, "int8")
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    layout = BatchLayout([5], [0], [[0, 1]], 4)
    assert torch.equal(engine.run_batch(x, layout, (0, 4), True), resident.forward(x, layout, resident.new_cache(8, 4)))
