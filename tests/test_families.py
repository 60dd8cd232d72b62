"""Model families beyond llama (Qwen3, Qwen3-MoE, Mixtral, Phi-3, Gemma 2/3, Mistral's sliding
window; yarn / dynamic / longrope / linear RoPE) against transformers, in process and through peers.

Every tiny checkpoint (`tests.tiny_models.FAMILIES`) is saved by transformers; contexts run to
~50 tokens, past every sliding window (8-12) and every RoPE length threshold (16 or 24).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import DistributedModel
from client.local_swarm import LocalSwarm
from shards import ModelConfig, ModelHead, Shard, UnsupportedModelError
from shards.moe import MoEBlock
from shards.quant import QuantLinear, memory_plan, quantize_shard
from tests.swarm_processes import new_test_swarm
from tests.test_shards_reference import prompts_for, reference_greedy, run_shards
from tests.tiny_models import FAMILIES

STEPS = 31  # decode steps after a 20-token prompt: 50 positions


def reference(path: Path, **overrides) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **overrides).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_two_shards_batched_match_transformers(tiny_model_factory, family: str) -> None:
    """Two shards, two sequences prefilled in one ragged batch then decoded together: every greedy
    token equals transformers' (each sequence run alone there), logits within 1e-4."""
    path = tiny_model_factory(family)
    head = ModelHead.from_pretrained(path)
    stages = [(Shard.from_pretrained(path, 0, 2), None), (Shard.from_pretrained(path, 2, 4), None)]
    prompts = prompts_for(320, [20, 7])
    tokens, logits = run_shards(head, stages, prompts, STEPS)
    for prompt, got_tokens, got_logits in zip(prompts, tokens, logits):
        # A fresh reference per sequence: transformers' dynamic RoPE keeps state across calls.
        want_tokens, want_logits = reference_greedy(reference(path), prompt, STEPS)
        assert got_tokens == want_tokens
        assert (got_logits - want_logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_moe_single_sequence_decode_matches_transformers(tiny_model_factory, family: str) -> None:
    """One sequence decodes one token per step: the MoE layer's single-token path (no grouping)."""
    path = tiny_model_factory(family)
    prompt = prompts_for(320, [20])
    tokens, logits = run_shards(ModelHead.from_pretrained(path), [(Shard.from_pretrained(path, 0, 4), None)], prompt, 12)
    want_tokens, want_logits = reference_greedy(reference(path), prompt[0], 12)
    assert tokens[0] == want_tokens
    assert (logits[0] - want_logits).abs().max().item() < 1e-4


# The feature each family's test would miss if it were ignored: transformers without it gives
# other tokens over the same context, so the test above really checks it.
FEATURES = {
    "mistral_window": {"sliding_window": None},
    "gemma2": {"attn_logit_softcapping": None},
    "qwen3": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    "mixtral": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
}


@pytest.mark.parametrize("family", sorted(FEATURES))
def test_features_change_the_reference(tiny_model_factory, family: str) -> None:
    path = tiny_model_factory(family)
    prompt = prompts_for(320, [20])[0]
    with_it, _ = reference_greedy(reference(path), prompt, STEPS)
    without, _ = reference_greedy(reference(path, **FEATURES[family]), prompt, STEPS)
    assert with_it != without


def test_config_fields_per_family(tiny_model_factory) -> None:
    g2 = ModelConfig.from_pretrained(tiny_model_factory("gemma2"))
    assert g2.unit_offset_norms and g2.attn_softcap == 5.0 and g2.final_softcap == 3.0 and g2.embed_scale == 8.0
    assert [g2.window(i) for i in range(4)] == [8, None, 8, None] and g2.attn_scale == 24**-0.5
    g3 = ModelConfig.from_pretrained(tiny_model_factory("gemma3"))
    assert g3.qk_norm and g3.local_rope is not None and g3.local_rope["rope_theta"] == 10000.0
    assert g3.rope_theta == 1e6 and g3.rope_scaling is not None and g3.rope_scaling["rope_type"] == "linear"
    moe = ModelConfig.from_pretrained(tiny_model_factory("qwen3_moe"))
    assert moe.num_experts == 4 and moe.dense_layers == (1,) and [moe.is_moe_layer(i) for i in range(3)] == [1, 0, 1]
    phi = ModelConfig.from_pretrained(tiny_model_factory("phi3"))
    assert phi.partial_rotary_factor == 0.5 and phi.rope_scaling["original_max_position_embeddings"] == 8
    assert [phi.window(i) for i in range(4)] == [10] * 4


def test_only_plain_llama_blocks_take_the_fused_decode_path(tiny_model_factory) -> None:
    fused = {v: Shard.from_pretrained(tiny_model_factory(v), 0, 2).supports_fused_decode for v in ("llama", "qwen2")}
    assert fused == {"llama": True, "qwen2": True}
    for family in FAMILIES:
        shard = Shard.from_pretrained(tiny_model_factory(family), 0, 2)
        assert not shard.supports_fused_decode, family
        assert shard.prefix_sharing_safe == (family not in ("mixtral", "phi3")), family  # dynamic / longrope RoPE


def test_moe_experts_quantize_and_the_memory_plan_counts_every_expert(tiny_model_factory) -> None:
    path = tiny_model_factory("mixtral")
    config = ModelConfig.from_pretrained(path)
    head = ModelHead.from_pretrained(path)
    shard = Shard.from_pretrained(path, 0, 4)
    prompt = prompts_for(320, [12])
    block = shard.blocks[0]
    assert isinstance(block, MoEBlock) and block._stacks() is not None  # float experts: grouped matmuls on CPU
    _, exact = run_shards(head, [(shard, None)], prompt, 3)
    quantize_shard(shard, "int8")
    assert all(isinstance(e.w_gate_up, QuantLinear) for e in block.experts)
    assert block._stacks() is None and block._stacked is None  # the float stacks are freed, experts loop
    _, quantized = run_shards(head, [(shard, None)], prompt, 3)
    err = (quantized[0] - exact[0]).abs().max().item()
    assert 0 < err < 0.05 * exact[0].abs().max().item()
    H, F, E = config.hidden_size, config.expert_intermediate_size, config.num_experts
    attention = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim * H + H * config.num_heads * config.head_dim
    plan = memory_plan(config, 1, "none", torch.float32, 0)
    assert plan["weight_bytes_per_layer"] == 4 * (2 * H + attention + E * 3 * F * H + E * H)


def test_unsupported_families_are_refused_in_one_line(tiny_model_factory, tmp_path: Path) -> None:
    src = tiny_model_factory("llama")
    for model_type, reason in [("gemma3", "gemma3_text"), ("deepseek_v3", "latent attention"), ("gpt2", "")]:
        folder = tmp_path / model_type
        folder.mkdir()
        config = json.loads((src / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(dict(config, model_type=model_type)))
        with pytest.raises(UnsupportedModelError, match=rf"{model_type}.*{reason}.*supported: llama"):
            ModelConfig.from_pretrained(folder)
    cli = subprocess.run(
        [sys.executable, "-m", "peer.cli", "serve", "--model", str(tmp_path / "deepseek_v3"), "--dry-run"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode != 0 and "Traceback" not in cli.stderr + cli.stdout
    assert "multi-head latent attention is not implemented" in cli.stderr


def e2e_prompts() -> list[list[int]]:
    """The end-to-end test's prompts: two sharing an 8-token prefix (batched), then a third alone."""
    prefix = prompts_for(320, [8])[0]
    return [prefix + tail for tail in prompts_for(300, [4, 9, 6])]


def greedy_margins(path: Path, prompt: list[int], steps: int) -> tuple[float, float]:
    """transformers' greedy run: the smallest gap between the best and second logit over the steps, and
    (mixture of experts) between the k-th and (k+1)-th router logit over every token and layer."""
    model = reference(path)  # fresh: dynamic RoPE keeps state across calls
    router_gaps = [float("inf")]

    def on_router(module: torch.nn.Module, _: tuple, out: tuple) -> None:
        top = out[0].float().topk(module.top_k + 1, dim=-1).values  # (tokens, k + 1)
        router_gaps.append((top[:, -2] - top[:, -1]).min().item())

    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "top_k"):
            gate.register_forward_hook(on_router)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                         output_logits=True, return_dict_in_generate=True)
    top = torch.cat(out.logits).topk(2, dim=-1).values  # (steps, 2)
    return (top[:, 0] - top[:, 1]).min().item(), min(router_gaps)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_near_ties_on_the_test_prompts(tiny_model_factory, family: str) -> None:
    """Our shards differ from transformers by ~2e-6 in the logits: a greedy choice or an expert choice
    decided by less than a few hundred times that could flip with the batch shape or thread count, and
    the token comparisons here would be flaky rather than wrong. So every checkpoint keeps a margin
    on every prompt the token tests use (`tests.tiny_models.SEEDS` picks weights that do)."""
    path = tiny_model_factory(family)
    runs = [(p, STEPS) for p in prompts_for(320, [20, 7])] + [(p, 8) for p in e2e_prompts()]
    if ModelConfig.from_pretrained(path).common_window(0, 2) is not None:
        runs.append((prompts_for(320, [10])[0], 40))  # the long-context test's run
    margins = [greedy_margins(path, prompt, steps) for prompt, steps in runs]
    assert min(m[0] for m in margins) > 5e-4, "greedy near-tie"
    assert min(m[1] for m in margins) > 2e-3, "router near-tie"


# -- through real peers ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dht_swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    swarm = new_test_swarm(tmp_path_factory.mktemp("families-swarm"))
    try:
        swarm.start_dht()
        yield swarm
    finally:
        swarm.close()


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_two_peers_generate_like_transformers(tiny_model_factory, dht_swarm: LocalSwarm, family: str) -> None:
    """Each family served by two `swarm-peer serve` processes (layers 0:2 and 2:4, pages of 4
    tokens; each checkpoint folder is its own model name on one DHT): a batch of two prompts
    sharing an 8-token prefix, then a third prompt that reuses the first peer's cached prefix
    pages; all greedy tokens equal transformers' generate of each prompt alone. Contexts reach
    25 tokens: past every window and RoPE threshold of the tiny configs."""
    path = tiny_model_factory(family)
    peers = [dht_swarm.start_peer(path, r, "--page-size", "4", wait=False) for r in ("0:2", "2:4")]
    for p in peers:
        dht_swarm.wait_online(p)
    a, b, c = e2e_prompts()
    remote = DistributedModel.from_pretrained(path, dht_swarm.initial_peers)
    try:
        width = max(len(a), len(b))
        ids = torch.zeros(2, width, dtype=torch.long)
        mask = torch.zeros(2, width, dtype=torch.long)
        for row, p in enumerate((a, b)):
            ids[row, width - len(p) :], mask[row, width - len(p) :] = torch.tensor(p), 1
        batched = remote.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, pad_token_id=0)
        before = remote.loop.run(remote.swarm.peer_info(peers[0].peer_id), timeout=40)["stats"]["prefix_tokens"]
        alone = remote.generate(torch.tensor([c]), max_new_tokens=8, min_new_tokens=8)
        after = remote.loop.run(remote.swarm.peer_info(peers[0].peer_id), timeout=40)["stats"]["prefix_tokens"]
    finally:
        remote.close()
        for p in peers:
            p.kill()
    for row, p in enumerate((a, b)):
        want = reference(path).generate(torch.tensor([p]), max_new_tokens=8, min_new_tokens=8, do_sample=False)[0, len(p) :]
        assert batched[row, width:].tolist() == want.tolist(), f"sequence {row}"
    want = reference(path).generate(torch.tensor([c]), max_new_tokens=8, min_new_tokens=8, do_sample=False)[0, len(c) :]
    assert alone[0, len(c) :].tolist() == want.tolist()
    if Shard.from_pretrained(path, 0, 2).prefix_sharing_safe:
        assert after - before >= 8, "the third prompt reused the two cached prefix pages"
    else:  # dynamic / longrope RoPE: a page's keys depend on the sequence's length, so peers never share them
        assert after == before


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral_window", "gemma3"])
def test_long_context_past_many_windows_keeps_pages_bounded(tiny_model_factory, dht_swarm: LocalSwarm,
                                                            family: str) -> None:
    """50 positions (six windows of 8) through two peers, pages of 4 tokens: greedy tokens equal
    transformers', and a peer whose layers all slide (mistral 0:2 and 2:4; gemma3 0:2) never held
    more than the window's pages, while gemma3's 2:4 (a global layer) keeps every page. Then a
    truncate back past freed pages: generation resumes exactly (the client replays the kept prefix)."""
    path = tiny_model_factory(family)
    ranges = ("0:2", "2:4")
    # A model name of its own: the killed peers of test_two_peers_generate_like_transformers (same
    # checkpoint, same DHT) stay listed until their records expire, and a route through one of
    # them costs a failover this test counts (CI saw 2 for gemma3's 1).
    name = f"{path.name}-long-context"
    peers = [dht_swarm.start_peer(path, r, "--page-size", "4", "--model-name", name, wait=False) for r in ranges]
    for p in peers:
        dht_swarm.wait_online(p)
    prompt = prompts_for(320, [10])[0]
    long_prompt = prompts_for(300, [30])[0]
    remote = DistributedModel.from_pretrained(path, dht_swarm.initial_peers, model_name=name)
    try:
        got = remote.generate(torch.tensor([prompt]), max_new_tokens=40, min_new_tokens=40)[0, len(prompt) :]
        peaks = {r: remote.loop.run(remote.swarm.peer_info(p.peer_id), timeout=40)["stats"]["peak_used_pages"]
                 for r, p in zip(ranges, peers)}
        with remote.inference_session(max_length=64) as session:
            # A prefill of 30, then one decode step: that step frees the pages of positions 0..19.
            remote.generate(torch.tensor([long_prompt]), max_new_tokens=2, min_new_tokens=2, session=session)
            # Back to 10: keys 3..9 slid out of the window at the peers that free pages; they refuse
            # (retryable) and the client replays the 10 kept positions into a new peer session.
            session.truncate(10)
            session.token_ids, session.pending = [long_prompt[:11]], [[long_prompt[10]]]
            resumed = remote.generate(torch.zeros(1, 0, dtype=torch.long), max_new_tokens=8, min_new_tokens=8,
                                      session=session)[0]
            failovers = session.stats.failovers
    finally:
        remote.close()
        for p in peers:
            p.kill()
    want = reference(path).generate(torch.tensor([prompt]), max_new_tokens=40, min_new_tokens=40, do_sample=False)
    assert got.tolist() == want[0, len(prompt) :].tolist()
    want = reference(path).generate(torch.tensor([long_prompt[:11]]), max_new_tokens=8, min_new_tokens=8,
                                    do_sample=False)[0, 11:]
    assert resumed.tolist() == want.tolist(), "after a truncate into freed pages"
    assert failovers == (2 if family == "mistral_window" else 1), "each peer that freed pages was replayed"
    window_pages = 8 // 4 + 1  # the pages a query's 8 keys can touch
    assert peaks["0:2"] <= window_pages
    if family == "gemma3":
        assert peaks["2:4"] >= 12, "layer 2 is global: the peer keeps all 49 positions (13 pages)"
    else:
        assert peaks["2:4"] <= window_pages
