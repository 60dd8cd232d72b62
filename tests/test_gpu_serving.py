"""GPU peers on the serving path: CUDA-graph decode inside `swarm-peer serve --device cuda`.

Skipped without CUDA (CI has none); run on a GPU machine with `pytest -m gpu`. The model is a
random-weight checkpoint of SmolLM2-135M's shape (30 layers, GQA 9/3 heads, vocab 49152), built
with transformers: the real weights are not available where the GPU runs.

- In process: `ServingEngine` with graphs == without graphs (float32 closely, bf16 to its tolerance)
  for every --quant mode, over batched decodes, shared prefix pages, a rewind (truncate) and
  padding buckets.
- Through real `swarm-peer` processes on CUDA in float32: greedy tokens equal transformers on the
  GPU, batched and concurrent sessions (decode batches run as graph replays), prefix sharing,
  speculative decoding (truncate), and a peer killed mid-generation.
- Through real processes in bfloat16: a peer replaying graphs equals a `--no-cuda-graphs` peer to
  bf16 tolerance.
"""

from __future__ import annotations

import gc
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from client.local_swarm import LocalSwarm
from peer.engine import ServingEngine
from shards.batch import BatchLayout
from shards.quant import quantize_shard
from shards.shard import Shard
from swarm.types import LayerRange

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PEER_START_TIMEOUT = 300.0  # first start compiles the Triton kernels and captures the graphs


def smollm2_shaped_checkpoint(path: Path) -> Path:
    """A seeded random checkpoint with SmolLM2-135M's configuration (float32 safetensors)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:  # larger than HF's init, so layers change the hidden state (peaked logits)
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
            else:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smollm2_shaped_checkpoint(tmp_path_factory.mktemp("smollm2-shaped"))


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 49000, (length + 3 * i,), generator=gen).tolist() for i in range(n)]


# ---------------------------------------------------------------- in process: graphs == eager


# Two bf16 evaluations of 30 layers that round in a different order differ by about 2% (measured on
# an H200: 1.7-2.2% per step for every quant mode), a wrong kernel by O(1); float32 must agree closely.
TOLERANCE = {torch.bfloat16: 3e-2, torch.float32: 1e-4}


@pytest.mark.parametrize("quant,dtype", [("none", torch.float32), ("none", torch.bfloat16),
                                         ("int8", torch.bfloat16), ("int4", torch.bfloat16)])
def test_graph_decode_equals_eager_decode(checkpoint: Path, quant: str, dtype: torch.dtype) -> None:
    shard = Shard.from_pretrained(checkpoint, 0, 30, dtype=dtype, device="cuda")
    quantize_shard(shard, quant, 64)
    ps, max_length = 16, 512
    graphs = ServingEngine(shard, num_pages=64, page_size=ps, max_length=max_length, graphs=True)
    eager = ServingEngine(shard, num_pages=64, page_size=ps, max_length=max_length, graphs=False)
    assert graphs.graphs is not None and eager.graphs is None
    span = (0, 30)
    gen = torch.Generator().manual_seed(1)
    # Sequence 0 and 1 share their first two pages (a common 32-token prefix); 2 and 3 are private.
    tables = [[0, 1, 2, 3, 4], [0, 1, 5, 6, 7], [8, 9, 10, 11, 12], [13, 14, 15, 16, 17]]
    prefill = [40, 0, 23, 9]  # sequence 1 brings only new tokens after the shared 32
    lengths = [0, 32, 0, 0]
    rows = torch.randn(sum(prefill) + 8, 576, generator=gen).to(dtype)
    layout = BatchLayout([40, 8, 23, 9], [0, 32, 0, 0], tables, ps)
    for engine in (graphs, eager):
        # The shared prefix: computed once by sequence 0's prefill, read by sequence 1's attention.
        engine.run_batch(rows, layout, span, True)
    lengths = [40, 40, 23, 9]

    def decode_both(seqs: list[int]) -> float:
        hidden = torch.randn(len(seqs), 576, generator=gen).to(dtype)
        lay = BatchLayout.decode([lengths[s] for s in seqs], [tables[s] for s in seqs], ps)
        a = graphs.run_batch(hidden, lay, span, True).float()
        b = eager.run_batch(hidden, lay, span, True).float()
        for s in seqs:
            lengths[s] += 1
        return float((a - b).norm() / b.norm())

    errors = [decode_both([0, 1, 2, 3]) for _ in range(6)]  # bucket 4
    errors += [decode_both([0, 2, 3]) for _ in range(4)]  # 3 rows in bucket 4: one padding row
    errors += [decode_both([1]) for _ in range(3)]  # bucket 1
    lengths[2] -= 5  # truncate: the next steps overwrite the last 5 positions of sequence 2
    errors += [decode_both([2, 3]) for _ in range(7)]
    assert graphs.steps["graph"] == 20 and eager.steps["graph"] == 0
    assert max(errors) < TOLERANCE[dtype], f"graph vs eager relative errors {errors}"


def test_a_move_captures_new_graphs_while_the_old_engine_serves(checkpoint: Path) -> None:
    """What `PeerServer.migrate` does: build (and capture) the next range's engine on one thread
    while the compute thread keeps replaying the current engine's graphs."""
    old = ServingEngine(Shard.from_pretrained(checkpoint, 0, 15, dtype=torch.bfloat16, device="cuda"),
                        num_pages=16, page_size=16, max_length=128)
    table = [[0, 1, 2]]
    old.run_batch(torch.randn(20, 576).to(torch.bfloat16), BatchLayout([20], [0], table, 16), (0, 15), True)
    built: list[ServingEngine] = []
    mover = threading.Thread(target=lambda: built.append(
        ServingEngine(Shard.from_pretrained(checkpoint, 15, 30, dtype=torch.bfloat16, device="cuda"),
                      num_pages=16, page_size=16, max_length=128)))
    mover.start()
    replays, deadline = 0, time.monotonic() + 120
    while (mover.is_alive() or replays < 5) and time.monotonic() < deadline:
        layout = BatchLayout.decode([20 + replays % 20], table, 16)
        out = old.run_batch(torch.randn(1, 576).to(torch.bfloat16), layout, (0, 15), True)
        assert out.isfinite().all()
        replays += 1
    mover.join(120)
    assert built and built[0].graphs is not None and built[0].graphs.graphs
    assert old.steps["graph"] == replays
    new = built[0]
    x = torch.randn(20, 576).to(torch.bfloat16)
    new.run_batch(x, BatchLayout([20], [0], table, 16), (15, 30), True)
    assert new.run_batch(x[:1], BatchLayout.decode([20], table, 16), (15, 30), True).isfinite().all()
    assert new.steps["graph"] == 1


def test_a_growing_engine_replays_its_loaded_layers_as_a_chain_of_graphs(checkpoint: Path) -> None:
    """What a join or move does while layers arrive (ServingEngine.load with on_grow): after each
    layer, a decode step over the loaded range replays the per-layer graphs captured so far (not
    the eager forward) and equals an eager engine's step; once all are there the whole range's
    graphs take over and the chain is dropped."""
    eager = ServingEngine(Shard.from_pretrained(checkpoint, 0, 30, dtype=torch.float32, device="cuda"),
                          num_pages=16, page_size=16, max_length=128, graphs=False)
    order = [14, 15, 13, 16, 12, *range(17, 30), *range(11, -1, -1)]  # each prefix one range, grown at both ends
    gen = torch.Generator().manual_seed(3)
    errors: list[float] = []

    def grew(engine: ServingEngine, served: LayerRange) -> None:  # on the loading thread, as in a peer
        span, table = (served.start, served.end), [[0, 1]]
        prompt = torch.randn(20, 576, generator=gen)
        token = torch.randn(1, 576, generator=gen)
        before = engine.steps["chain"]
        outs = []
        for e in (engine, eager):
            e.run_batch(prompt, BatchLayout([20], [0], table, 16), span, True)  # prefill: eager on both
            outs.append(e.run_batch(token, BatchLayout.decode([20], table, 16), span, True))
        assert engine.steps["chain"] == before + 1 and engine.graphs is None
        errors.append(float((outs[0] - outs[1]).norm() / outs[1].norm()))

    grown = ServingEngine.load(str(checkpoint), LayerRange(0, 30), dtype=torch.float32, device="cuda", quant="none",
                               quant_group_size=64, num_pages=16, page_size=16, max_length=128, order=order,
                               on_grow=grew)
    assert len(errors) == 30 and max(errors) < TOLERANCE[torch.float32], errors
    assert grown.graphs is not None and grown.chain is None
    table = [[0, 1]]
    grown.run_batch(torch.randn(20, 576), BatchLayout([20], [0], table, 16), (0, 30), True)
    grown.run_batch(torch.randn(1, 576), BatchLayout.decode([20], table, 16), (0, 30), True)
    assert grown.steps["graph"] == 1


def test_a_dropped_engine_gives_its_memory_back(checkpoint: Path) -> None:
    """A move in place (`PeerServer._release_engine`) frees the old engine by dropping it: no
    graph pool, cache or weight may stay behind, or the new range would not fit."""

    def build_run_and_drop() -> tuple[int, int]:
        """(bytes the engine held, bytes allocated once it is dropped)"""
        start = torch.cuda.memory_allocated()
        engine = ServingEngine(Shard.from_pretrained(checkpoint, 0, 15, dtype=torch.bfloat16, device="cuda"),
                               num_pages=64, page_size=16, max_length=512)
        engine.run_batch(torch.randn(20, 576).to(torch.bfloat16), BatchLayout([20], [0], [[0, 1]], 16), (0, 15), True)
        engine.run_batch(torch.randn(1, 576).to(torch.bfloat16), BatchLayout.decode([20], [[0, 1]], 16), (0, 15), True)
        assert engine.steps["graph"] == 1
        held = torch.cuda.memory_allocated() - start
        del engine
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        return held, torch.cuda.memory_allocated()

    gc.collect()
    before = torch.cuda.memory_allocated()
    held, after_first = build_run_and_drop()
    assert held > 100 * 2**20  # weights, cache and graph pools of 15 layers
    # The first engine's kernels leave process-wide workspaces behind (cuBLAS: 96 MiB measured on
    # an H200), allocated once: far less than the engine. A second engine's memory all comes back.
    assert after_first - before < held / 2, f"{before=} {held=} {after_first=}"
    _, after_second = build_run_and_drop()
    assert after_second - after_first < 0.02 * held, f"the dropped engine kept its memory: {after_first=} {after_second=}"


# ---------------------------------------------------------------- through real peer processes


@pytest.fixture(scope="module")
def gpu_swarm(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    swarm = LocalSwarm(tmp_path_factory.mktemp("gpu-swarm"))
    try:
        swarm.start_dht()
        cuda = ("--device", "cuda", "--dtype", "float32", "--cache-tokens", "16384")
        peers = [swarm.start_peer(checkpoint, r, *cuda, wait=False) for r in ("0:15", "15:30", "15:30")]
        for peer in peers:
            swarm.wait_online(peer, PEER_START_TIMEOUT)
        yield swarm
    finally:
        swarm.close()


@pytest.fixture(scope="module")
def reference(checkpoint: Path):
    return greedy_reference(checkpoint)


def greedy_reference(checkpoint: Path):
    """transformers' greedy continuation on the GPU: greedy(ids, n) -> n new token ids."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).to("cuda").eval()
    model.generation_config.eos_token_id = None

    def greedy(ids: list[int], n: int) -> list[int]:
        out = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=n, do_sample=False, pad_token_id=0)
        return out[0, len(ids):].tolist()

    return greedy


@pytest.fixture(scope="module")
def client(checkpoint: Path, gpu_swarm: LocalSwarm):
    from client import DistributedModel

    model = DistributedModel.from_pretrained(checkpoint, gpu_swarm.initial_peers, device="cuda", dtype=torch.float32)
    try:
        yield model
    finally:
        model.close()


def generate(model, ids: list[int], n: int, **kwargs) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, eos_token_id=[], **kwargs)
    return out[0, len(ids):].tolist()


def peer_stats(model, peer_id: str) -> dict:
    return model.loop.run(model.swarm.peer_info(peer_id), timeout=60)["stats"]


def test_client_head_runs_on_the_gpu(client) -> None:
    assert client.device.type == "cuda" and client.head.embedding.is_cuda


def test_greedy_tokens_equal_transformers_on_the_gpu(client, reference, gpu_swarm) -> None:
    for ids in prompts(3, 20, seed=2):
        assert generate(client, ids, 24) == reference(ids, 24)
    graph = sum(peer_stats(client, p.peer_id)["graph_batches"] for p in gpu_swarm.processes[1:])
    assert graph > 0, "decode steps did not run as CUDA-graph replays"


def test_concurrent_sessions_batch_into_graph_replays(client, reference, gpu_swarm) -> None:
    many = prompts(8, 12, seed=3)
    want = [reference(ids, 16) for ids in many]
    got: list[list[int] | BaseException | None] = [None] * len(many)
    barrier = threading.Barrier(len(many))

    def run(i: int) -> None:
        try:
            barrier.wait()
            got[i] = generate(client, many[i], 16)
        except BaseException as e:  # reported below
            got[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(many))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert got == want
    first = gpu_swarm.processes[1].peer_id
    assert peer_stats(client, first)["max_batch_sequences"] > 1


def test_prefix_sharing_and_speculative_truncate_keep_tokens(client, reference, gpu_swarm) -> None:
    ids = prompts(1, 48, seed=4)[0]
    want = reference(ids, 20)
    first = gpu_swarm.processes[1].peer_id
    hits = peer_stats(client, first)["prefix_hits_pages"]
    assert generate(client, ids, 20) == want
    assert generate(client, ids, 20) == want  # the second run attaches the first run's pages
    assert peer_stats(client, first)["prefix_hits_pages"] > hits
    # prompt_lookup verifies drafts in one step and truncates the rejected ones on every peer.
    assert generate(client, ids + ids[:16], 20, speculative="prompt_lookup") == reference(ids + ids[:16], 20)


class KillAfter:
    """A generate() streamer that calls `kill` after the prompt and `tokens` new tokens."""

    def __init__(self, tokens: int, kill: Callable[[], None]) -> None:
        self.tokens, self.kill, self.seen = tokens, kill, 0

    def put(self, value: torch.Tensor) -> None:
        self.seen += 1  # the first call brings the prompt
        if self.seen == self.tokens + 1:
            self.kill()

    def end(self) -> None:
        pass


def test_peer_killed_mid_generation_gives_the_same_tokens(client, reference, gpu_swarm) -> None:
    ids = prompts(1, 16, seed=5)[0]
    want = reference(ids, 32)

    with client.inference_session(max_length=64) as session:

        def kill_the_second_hop() -> None:
            victim = next(h.peer_id for h in session.hops if h.layers.start == 15)
            next(p for p in gpu_swarm.processes if p.peer_id == victim).kill()

        got = client.generate(torch.tensor([ids]), max_new_tokens=32, eos_token_id=[], session=session,
                              streamer=KillAfter(5, kill_the_second_hop))
    assert got[0, len(ids):].tolist() == want
    assert session.stats.failovers >= 1


def test_bf16_graph_peer_equals_eager_peer(checkpoint: Path, tmp_path: Path) -> None:
    from client import DistributedModel

    with LocalSwarm(tmp_path) as swarm:
        swarm.start_dht()
        bf16 = ("--device", "cuda", "--dtype", "bfloat16")
        peers = [swarm.start_peer(checkpoint, "0:30", *bf16, "--model-name", "graphs", wait=False),
                 swarm.start_peer(checkpoint, "0:30", *bf16, "--model-name", "eager", "--no-cuda-graphs", wait=False)]
        for peer in peers:
            swarm.wait_online(peer, PEER_START_TIMEOUT)
        gen = torch.Generator().manual_seed(6)
        steps = [torch.randn(20, 576, generator=gen)] + [torch.randn(1, 576, generator=gen) for _ in range(12)]
        outputs = {}
        for name in ("graphs", "eager"):
            with DistributedModel.from_pretrained(checkpoint, swarm.initial_peers, model_name=name,
                                                  device="cuda", dtype=torch.bfloat16) as model:
                with model.inference_session(max_length=64) as session:
                    outputs[name] = [session.step(x, [x.shape[0]]) for x in steps]
                stats = peer_stats(model, peers[0 if name == "graphs" else 1].peer_id)
                assert (stats["graph_batches"] > 0) == (name == "graphs")
        for a, b in zip(outputs["graphs"], outputs["eager"]):
            assert float((a - b).norm() / b.norm()) < 2e-2


def test_a_gpu_peer_moves_in_place_and_serves_its_new_layers(checkpoint: Path, reference, tmp_path: Path) -> None:
    """A self-placing GPU peer whose layers another peer also serves moves in place into a gap:
    it drops its engine before loading the new range, serves each layer as it arrives, captures
    the new range's graphs, and tokens through it equal transformers."""
    from client import DistributedModel

    cuda = ("--device", "cuda", "--dtype", "float32", "--cache-tokens", "4096", "--announce-ttl", "6",
            "--model-name", "moves")
    with LocalSwarm(tmp_path) as swarm:
        swarm.start_dht()
        first = swarm.start_peer(checkpoint, "0:15", *cuda, wait=False)
        swarm.wait_online(first, PEER_START_TIMEOUT)
        mover = swarm.start_peer(checkpoint, None, "--num-layers", "15", "--balance-period", "3", "--move-mode",
                                 "in-place", *cuda, wait=False)
        swarm.wait_online(mover, PEER_START_TIMEOUT)
        joined = mover.log_text()
        assert "chose layers 15:30" in joined
        # Its join grew too (a layer at a time), then measured the whole range on its CUDA graphs:
        # the first layer's speed over 15 layers bears 15 steps' fixed costs, far below it.
        assert "(the rest still loading)" in joined and "joined: serving layers 15:30" in joined, mover.log_tail()
        speeds = re.search(r"throughput on CUDA graphs: ([\d.]+) tokens/s through 15 layers \(([\d.]+) from its first "
                           r"layer\)", joined)
        assert speeds and float(speeds[1]) > float(speeds[2]), mover.log_tail()
        second = swarm.start_peer(checkpoint, "15:30", *cuda, wait=False)
        swarm.wait_online(second, PEER_START_TIMEOUT)
        first.kill()  # 0:15 loses its only server; the mover's layers keep `second`
        deadline = time.monotonic() + 180
        while "now serving layers 0:15" not in mover.log_text() and time.monotonic() < deadline:
            time.sleep(1)
        log = mover.log_text()[len(joined):]
        assert "in place (--move-mode in-place)" in log and "now serving layers 0:15" in log, mover.log_tail()
        # It served the gap's layers as they arrived (on per-layer graphs), then captured the whole range's.
        assert "serving each layer as it arrives" in log and "(the rest still loading)" in log, mover.log_tail()
        # ... announcing, while it grew, the speed per layer its whole range had on graphs (the
        # partial range replays per-layer graphs), not the first layer's, which bears a step's fixed costs.
        grown = re.findall(r"serving layers (\d+):(\d+) of 0:15 at ([\d.]+) tokens/s", log)
        assert grown, mover.log_tail()
        for start, end, speed in grown:
            assert float(speed) * (int(end) - int(start)) == pytest.approx(float(speeds[1]) * 15, rel=0.01)
        with DistributedModel.from_pretrained(checkpoint, swarm.initial_peers, model_name="moves", device="cuda",
                                              dtype=torch.float32) as model:
            ids = prompts(1, 16, seed=7)[0]
            assert generate(model, ids, 16) == reference(ids, 16)
            assert peer_stats(model, mover.peer_id)["graph_batches"] > 0
