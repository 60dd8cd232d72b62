"""Reading a load's next layer while the current one is installed (shards/read_ahead.py).

A GPU peer's loads take this path (Shard.from_pretrained reads ahead on any device but the CPU); here it
is forced on the CPU and checked against the plain path: the same weights and outputs, layers in the
asked order, at most two layers in host memory, and a failed or abandoned load stops reading.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import AutoModelForCausalLM

from shards import CheckpointError, ModelHead, Shard
from shards import read_ahead as read_ahead_module
from shards.read_ahead import LayerReadAhead, host_copy
from tests.test_shards_reference import prompts_for, reference_greedy, run_shards


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_shard_read_ahead_equals_the_plain_load(tiny_model, dtype: torch.dtype) -> None:
    order = [2, 0, 3, 1]
    seen: dict[str, list[int]] = {"plain": [], "ahead": []}
    plain = Shard.from_pretrained(
        tiny_model,
        0,
        4,
        dtype=dtype,
        order=order,
        read_ahead=False,
        on_layer=lambda _, layer: seen["plain"].append(layer),
    )
    ahead = Shard.from_pretrained(
        tiny_model,
        0,
        4,
        dtype=dtype,
        order=order,
        read_ahead=True,
        on_layer=lambda _, layer: seen["ahead"].append(layer),
    )
    assert seen["ahead"] == seen["plain"] == order
    plain_state, ahead_state = plain.state_dict(), ahead.state_dict()
    assert plain_state.keys() == ahead_state.keys() and plain_state
    for name, value in plain_state.items():
        assert ahead_state[name].dtype == value.dtype == dtype, name
        assert torch.equal(ahead_state[name], value), name
    assert ahead.fingerprint == plain.fingerprint


def test_a_read_ahead_shard_generates_what_transformers_does(tiny_model) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompt = prompts_for(320, [9])[0]
    stages = [
        (Shard.from_pretrained(tiny_model, 0, 2, read_ahead=True), None),
        (Shard.from_pretrained(tiny_model, 2, 4, read_ahead=True), None),
    ]
    tokens, _ = run_shards(ModelHead.from_pretrained(tiny_model), stages, [prompt], 8)
    assert tokens[0] == reference_greedy(model, prompt, 8)[0]


def test_host_copy_reads_every_chunk_into_its_own_memory(monkeypatch) -> None:
    monkeypatch.setattr(read_ahead_module, "CHUNK_BYTES", 4096)  # many chunks from a small tensor
    source = torch.randn(333, 77)
    with ThreadPoolExecutor(3) as pool:
        copy = host_copy(source, pool)
    assert copy.shape == source.shape and torch.equal(copy, source)
    assert copy.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()


def _recording_read(log: list[tuple[str, int]], lock: threading.Lock, fail_at: int | None = None):
    def read(layer: int) -> dict[str, torch.Tensor]:
        with lock:
            log.append(("read", layer))
        if layer == fail_at:
            raise CheckpointError(f"layer {layer}: cannot read tensors")
        return {"w": torch.full((64,), float(layer))}

    return read


def test_layers_come_in_order_with_at_most_one_read_ahead() -> None:
    log: list[tuple[str, int]] = []
    lock = threading.Lock()
    order = [5, 3, 4, 0, 1]
    with LayerReadAhead(order, _recording_read(log, lock)) as ahead:
        for layer, tensors in ahead:
            assert torch.equal(tensors["w"], torch.full((64,), float(layer)))
            with lock:
                reads = [x for kind, x in log if kind == "read"]
            # The layer in hand and at most the next one: two layers in host memory.
            assert reads[: order.index(layer) + 1] == order[: order.index(layer) + 1]
            assert len(reads) <= order.index(layer) + 2, reads
            log.append(("used", layer))
    assert [x for kind, x in log if kind == "used"] == order


def test_a_failed_read_raises_at_its_layer_and_an_abandoned_load_stops_reading() -> None:
    log: list[tuple[str, int]] = []
    lock = threading.Lock()
    used = []
    with pytest.raises(CheckpointError, match="layer 2"):
        with LayerReadAhead([0, 1, 2, 3], _recording_read(log, lock, fail_at=2)) as ahead:
            for layer, _ in ahead:
                used.append(layer)
    assert used == [0, 1]
    assert ("read", 3) not in log  # nothing is read past the failure

    log.clear()
    with LayerReadAhead(list(range(10)), _recording_read(log, lock)) as ahead:
        for _ in ahead:
            break  # a cancelled move
    assert len(log) <= 2  # the layer taken and the one read ahead, no more


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_load_reads_ahead_by_default_and_equals_the_plain_load(tiny_model) -> None:
    order = [1, 3, 0, 2]
    plain = Shard.from_pretrained(tiny_model, 0, 4, dtype=torch.bfloat16, device="cuda", order=order,
                                  read_ahead=False)
    ahead = Shard.from_pretrained(tiny_model, 0, 4, dtype=torch.bfloat16, device="cuda", order=order)
    for name, value in plain.state_dict().items():
        got = ahead.state_dict()[name]
        assert got.device.type == "cuda" and got.dtype == value.dtype, name
        assert torch.equal(got, value), name
