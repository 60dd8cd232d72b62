"""Shards chained with a paged cache reproduce transformers' logits and greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from shards import BatchLayout, ModelHead, PagePool, PageTable, Shard

PREFILL, DECODE_STEPS, ATOL = 20, 30, 1e-4


def reference_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """transformers with its DynamicCache: greedy tokens and logits (len(prompt) + steps - 1, V)."""
    cache = DynamicCache(config=model.config)
    ids, logits, tokens = torch.tensor([prompt]), [], []
    with torch.no_grad():
        for _ in range(steps):
            out = model(ids, cache=cache, use_cache=True).logits[0]  # (T, V)
            logits.append(out)
            tokens.append(int(out[-1].argmax()))
            ids = torch.tensor([[tokens[-1]]])
    return tokens, torch.cat(logits)


def run_shards(
    head: ModelHead,
    stages: list[tuple[Shard, tuple[int, int] | None]],
    prompts: list[list[int]],
    steps: int,
    page_size: int = 4,
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill all prompts in one ragged batch, then decode them together greedily.

    `stages` are (shard, layers) run in order; one shard may appear twice with sub-ranges.
    Returns per sequence its greedy tokens and logits (len(prompt) + steps - 1, V).
    """
    pool = PagePool(num_pages=64, page_size=page_size)
    caches = {id(s): s.new_cache(pool.num_pages, page_size) for s, _ in stages}
    tables = [PageTable() for _ in prompts]
    new = [list(p) for p in prompts]
    tokens: list[list[int]] = [[] for _ in prompts]
    logits: list[list[torch.Tensor]] = [[] for _ in prompts]
    for _ in range(steps):
        cached = [t.length for t in tables]
        for t, n in zip(tables, new):
            assert t.reserve(pool, t.length + len(n))
        layout = BatchLayout([len(n) for n in new], cached, [t.pages for t in tables], page_size)
        hidden = head.embed(torch.tensor([x for n in new for x in n]))  # (N, H)
        for shard, layers in stages:
            hidden = shard(hidden, layout, caches[id(shard)], layers=layers)
        out = head.logits(hidden).split(layout.new_tokens)  # B x (n_i, V)
        for i, o in enumerate(out):
            logits[i].append(o)
            tokens[i].append(int(o[-1].argmax()))
        new = [[t[-1]] for t in tokens]
    for t in tables:
        t.release(pool)
    assert pool.num_free == pool.num_pages
    return tokens, [torch.cat(x) for x in logits]


def check_against_reference(path: Path, split: int, prompts: list[list[int]], dtype=torch.float32) -> None:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    n = model.config.num_hidden_layers
    head = ModelHead.from_pretrained(path)
    stages = [(Shard.from_pretrained(path, 0, split), None), (Shard.from_pretrained(path, split, n), None)]
    got_tokens, got_logits = run_shards(head, stages, prompts, DECODE_STEPS + 1)
    for prompt, tokens, logits in zip(prompts, got_tokens, got_logits):
        ref_tokens, ref_logits = reference_greedy(model, prompt, DECODE_STEPS + 1)
        assert tokens == ref_tokens
        assert (logits - ref_logits).abs().max().item() < ATOL


def prompts_for(vocab: int, lengths: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def test_two_shards_match_transformers(tiny_model_variant: Path) -> None:
    check_against_reference(tiny_model_variant, 2, prompts_for(320, [PREFILL]))


def test_three_sequences_batched_match_transformers(tiny_model_variant: Path) -> None:
    check_against_reference(tiny_model_variant, 1, prompts_for(320, [PREFILL, 7, 13]))


def test_sub_ranges_of_one_shard(tiny_model: Path) -> None:
    """Running [0, n) as layers=(0, 1) then (1, n) equals running it whole, with one cache."""
    head = ModelHead.from_pretrained(tiny_model)
    shard = Shard.from_pretrained(tiny_model, 0, 4)
    prompts = prompts_for(320, [9, 4])
    whole = run_shards(head, [(shard, None)], prompts, 5)
    parts = run_shards(head, [(shard, (0, 1)), (shard, (1, 4))], prompts, 5)
    assert whole[0] == parts[0]
    for a, b in zip(whole[1], parts[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="not inside"):
        shard(torch.zeros(1, 64), BatchLayout([1], [0], None), None, layers=(2, 5))


def test_stateless_forward_matches_transformers(tiny_model_variant: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_variant, dtype=torch.float32).eval()
    n = model.config.num_hidden_layers
    head = ModelHead.from_pretrained(tiny_model_variant)
    shards = [Shard.from_pretrained(tiny_model_variant, 0, 3), Shard.from_pretrained(tiny_model_variant, 3, n)]
    prompts = prompts_for(320, [PREFILL, 5, 11])
    layout = BatchLayout([len(p) for p in prompts], [0, 0, 0], None)
    hidden = head.embed(torch.tensor(sum(prompts, [])))  # (N, H)
    for s in shards:
        hidden = s(hidden, layout, None)
    for prompt, got in zip(prompts, head.logits(hidden).split(layout.new_tokens)):
        with torch.no_grad():
            ref = model(torch.tensor([prompt])).logits[0]
        assert (got - ref).abs().max().item() < ATOL


def test_bfloat16_runs_without_nan(tiny_model_variant: Path) -> None:
    head = ModelHead.from_pretrained(tiny_model_variant, dtype=torch.bfloat16)
    shard = Shard.from_pretrained(tiny_model_variant, 0, 4, dtype=torch.bfloat16)
    tokens, logits = run_shards(head, [(shard, None)], prompts_for(320, [PREFILL, 6]), 6)
    assert all(torch.isfinite(x.float()).all() for x in logits)
    assert shard.new_cache(2).k[0].dtype == torch.bfloat16


@pytest.mark.demo_model
@pytest.mark.slow
def test_demo_model_shards_match_transformers(demo_model: Path) -> None:
    # One batched run covers the single-sequence case too: each sequence is compared alone.
    check_against_reference(demo_model, 17, prompts_for(49152, [PREFILL, 9, 14]))


@pytest.mark.demo_model
@pytest.mark.slow
def test_demo_model_bfloat16_and_stateless(demo_model: Path) -> None:
    head = ModelHead.from_pretrained(demo_model, dtype=torch.bfloat16)
    shard = Shard.from_pretrained(demo_model, 0, 30, dtype=torch.bfloat16)
    _, logits = run_shards(head, [(shard, (0, 10)), (shard, (10, 30))], prompts_for(49152, [PREFILL]), 4)
    assert torch.isfinite(logits[0].float()).all()
    head32 = ModelHead.from_pretrained(demo_model)
    shard32 = Shard.from_pretrained(demo_model, 0, 30)
    model = AutoModelForCausalLM.from_pretrained(demo_model, dtype=torch.float32).eval()
    prompt = prompts_for(49152, [PREFILL])[0]
    got = head32.logits(shard32(head32.embed(torch.tensor(prompt)), BatchLayout([PREFILL], [0], None), None))
    with torch.no_grad():
        ref = model(torch.tensor([prompt])).logits[0]
    assert (got - ref).abs().max().item() < ATOL
