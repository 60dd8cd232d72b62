"""Streamed weights on a GPU (`swarm-peer serve --stream-weights`): pinned host memory, a copy stream.

Skipped without CUDA (CI has none); run on a GPU machine with `pytest -m gpu`. The checkpoint is
tests/test_gpu_serving.py's random one of SmolLM2-135M's shape (30 layers).

- In process: a streamed engine computes what a resident eager one does (float32 closely, int8 in
  bf16 to its tolerance) over prefill, batched decodes and a layer sub-range, holding only two
  layers' weights on the device.
- Through real processes: a standby streaming its weights through the GPU takes over from the GPU
  peer it guards when that peer is killed mid-generation, with transformers' tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from client.local_swarm import LocalSwarm
from peer.engine import ServingEngine
from shards.batch import BatchLayout
from swarm.types import LayerRange
from tests.test_gpu_serving import (
    PEER_START_TIMEOUT,
    TOLERANCE,
    KillAfter,
    generate,
    greedy_reference,
    peer_stats,
    prompts,
    smollm2_shaped_checkpoint,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smollm2_shaped_checkpoint(tmp_path_factory.mktemp("smollm2-shaped"))


@pytest.fixture(scope="module")
def reference(checkpoint: Path):
    return greedy_reference(checkpoint)


@pytest.mark.parametrize("quant,dtype", [("none", torch.float32), ("int8", torch.bfloat16)])
def test_a_streamed_engine_computes_what_a_resident_one_does(checkpoint: Path, quant: str, dtype: torch.dtype) -> None:
    def load(stream: bool) -> ServingEngine:
        return ServingEngine.load(str(checkpoint), LayerRange(0, 30), dtype=dtype, device="cuda", quant=quant,
                                  quant_group_size=128, num_pages=64, page_size=16, max_length=512, graphs=False,
                                  stream_weights=stream)

    resident = load(False)
    before = torch.cuda.memory_allocated()
    streamed = load(True)
    on_device = torch.cuda.memory_allocated() - before
    weights = sum(t.numel() * t.element_size() for t in resident.shard.blocks.state_dict().values())
    cache = sum(t.numel() * t.element_size() for t in [*streamed.cache.k, *streamed.cache.v])
    assert streamed.shard.streamer is not None and streamed.graphs is None
    assert on_device - cache <= 2 * weights / 30 + 2**20, "more than two layers' weights on the device"
    assert all(t.device.type == "cpu" and t.is_pinned() for t in streamed.shard.blocks.state_dict().values())
    gen = torch.Generator().manual_seed(3)
    tables = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    lengths = [37, 20, 9]
    prefill = BatchLayout(lengths, [0, 0, 0], tables, 16)
    errors = []
    rows = torch.randn(sum(lengths), 576, generator=gen).to(dtype)
    pair = [e.run_batch(rows, prefill, (0, 30), True).float() for e in (resident, streamed)]
    errors.append(float((pair[1] - pair[0]).norm() / pair[0].norm()))
    for _ in range(8):
        hidden = torch.randn(3, 576, generator=gen).to(dtype)
        decode = BatchLayout.decode(lengths, tables, 16)
        pair = [e.run_batch(hidden, decode, (0, 30), True).float() for e in (resident, streamed)]
        errors.append(float((pair[1] - pair[0]).norm() / pair[0].norm()))
        lengths = [n + 1 for n in lengths]
    stateless = BatchLayout([5], [0], None, 16)
    z = torch.randn(5, 576, generator=gen).to(dtype)
    pair = [e.run_batch(z, stateless, (11, 17), False).float() for e in (resident, streamed)]
    errors.append(float((pair[1] - pair[0]).norm() / pair[0].norm()))
    assert max(errors) < TOLERANCE[dtype], f"streamed vs resident relative errors {errors}"


def test_a_streaming_standby_takes_over_a_killed_gpu_peer_with_the_same_tokens(checkpoint: Path, reference,
                                                                               tmp_path: Path) -> None:
    from client import DistributedModel

    cuda = ("--device", "cuda", "--dtype", "float32", "--cache-tokens", "4096", "--model-name", "streamed")
    with LocalSwarm(tmp_path) as swarm:
        swarm.start_dht()
        gpu_peer = swarm.start_peer(checkpoint, "0:30", *cuda, wait=False)
        swarm.wait_online(gpu_peer, PEER_START_TIMEOUT)
        standby = swarm.start_peer(checkpoint, None, "--standby", "--stream-weights", "--num-layers", "30", *cuda,
                                   wait=False)
        swarm.wait_online(standby, PEER_START_TIMEOUT)
        assert "weights streamed from host memory" in standby.log_text(), standby.log_tail()
        ids = prompts(1, 16, seed=7)[0]
        want = reference(ids, 24)
        with DistributedModel.from_pretrained(checkpoint, swarm.initial_peers, model_name="streamed", device="cuda",
                                              dtype=torch.float32) as model:
            assert generate(model, ids, 24) == want  # through the GPU peer: a standby is the last resort
            assert peer_stats(model, standby.peer_id)["batches_run"] == 0
            with model.inference_session(max_length=64) as session:
                got = model.generate(torch.tensor([ids]), max_new_tokens=24, eos_token_id=[], session=session,
                                     streamer=KillAfter(5, gpu_peer.kill))
            assert got[0, len(ids):].tolist() == want
            assert session.stats.failovers >= 1
            assert [h.peer_id for h in session.hops] == [standby.peer_id]
            assert peer_stats(model, standby.peer_id)["batches_run"] > 0
