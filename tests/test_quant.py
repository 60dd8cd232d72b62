"""Quantize-on-load (CPU): module swap, memory plan, quantized shard close to the original, and
perplexity on SmolLM2 of a fixed English text shipped with the OS (/usr/share/common-licenses/GPL-3),
GPTQ-calibrated on another (Apache-2.0)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from benchmarks.bench_gpu import LLAMA2_7B
from peer.quantize_cli import DEFAULT_CALIBRATION
from shards import BatchLayout, ModelHead, Shard
from shards.calibrate import calibrate_shard, calibration_batch
from shards.quant import QuantLinear, memory_plan, quantize_shard
from tests.kernel_helpers import random_shard, rel_err, tiny_config

TEXT = Path("/usr/share/common-licenses/GPL-3")  # Debian's base-files; 35 KB of English
MIXED_INT8 = ("wqkv", "wo", "w_down")  # `swarm-peer quantize --int8 wqkv,wo,w_down`
CALIBRATION = DEFAULT_CALIBRATION  # Apache-2.0, same package: another text than the one evaluated
PPL_TOKENS = 1024


def test_quantize_shard_swaps_linears_and_keeps_norms() -> None:
    shard = random_shard(tiny_config(2, attention_bias=True), torch.float32, "cpu")
    quantize_shard(shard, "int4", 64)
    blk = shard.blocks[0]
    assert all(isinstance(getattr(blk, n), QuantLinear) for n in ("wqkv", "wo", "w_gate_up", "w_down"))
    assert blk.wqkv.bias is not None and blk.wqkv.qweight.dtype == torch.uint8
    assert isinstance(blk.input_norm.weight, torch.nn.Parameter)
    with pytest.raises(ValueError, match="unknown quantization"):
        quantize_shard(shard, "int3")


@pytest.mark.parametrize("mode,tol", [("int8", 0.02), ("int4", 0.15)])
def test_quantized_shard_close_to_original(mode: str, tol: float) -> None:
    cfg = tiny_config(2)
    ref_shard, q_shard = (random_shard(cfg, torch.float32, "cpu", seed=3) for _ in range(2))
    quantize_shard(q_shard, mode, 64)
    lay = BatchLayout([7, 3], [0, 0], [[0], [1]], 16)
    h = torch.randn(10, cfg.hidden_size)
    ref = ref_shard(h, lay, ref_shard.new_cache(4, 16))
    out = q_shard(h, lay, q_shard.new_cache(4, 16))
    assert rel_err(out, ref) < tol


def test_memory_plan_llama2_7b() -> None:
    cfg = LLAMA2_7B
    gb = {m: memory_plan(cfg, 32, m, torch.bfloat16, 4096) for m in ("none", "int8", "int4")}
    assert gb["none"]["weight_bytes"] == 32 * (2 * 4096 * 2 + 202_375_168 * 2)
    assert gb["none"]["kv_cache_bytes"] == 4096 * 32 * 2 * 4096 * 2  # 2 GiB for 4096 tokens
    assert 0.49 < gb["int8"]["weight_bytes"] / gb["none"]["weight_bytes"] < 0.51
    assert 0.26 < gb["int4"]["weight_bytes"] / gb["none"]["weight_bytes"] < 0.27  # nibbles + bf16 scale/min
    g64 = memory_plan(cfg, 32, "int4", torch.bfloat16, 0, group_size=64)
    assert g64["weight_bytes"] > gb["int4"]["weight_bytes"] and g64["total_bytes"] == g64["weight_bytes"]


def _perplexity(shard: Shard, head: ModelHead, ids: torch.Tensor) -> float:
    n = ids.numel()
    lay = BatchLayout([n], [0], None)  # stateless: one causal pass over the text
    hidden = shard(head.embed(ids), lay, None)
    logits = head.logits(hidden).float()  # (n, V)
    return math.exp(torch.nn.functional.cross_entropy(logits[:-1], ids[1:]).item())


@pytest.mark.slow
@pytest.mark.demo_model
def test_quantized_perplexity_on_smollm2(demo_model: Path) -> None:
    """int8 within 1%; int4 group 32 within 8%; GPTQ calibration (on another text) at group 128 no
    more than 15% worse than int4 round-to-nearest (whether it is better turns on floating-point
    noise on this model, below; tests/test_quant_checkpoint.py asserts its lower output error); the mixed mode (GPTQ int4 MLP up-projection, int8 rest) within 8%. The demo model's weights are themselves a Q4_1 GGUF (4-bit,
    groups of 32) dequantized, so group 32 reproduces them and group 128 cannot."""
    if not TEXT.is_file() or not CALIBRATION.is_file():
        pytest.skip(f"{TEXT} or {CALIBRATION} not present on this OS")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_model)
    ids = torch.tensor(tok(TEXT.read_text())["input_ids"][:PPL_TOKENS])
    calib_ids = torch.tensor(tok(CALIBRATION.read_text())["input_ids"][:2048])
    head = ModelHead.from_pretrained(demo_model)
    torch.manual_seed(0)
    ppl = {}
    for name, mode, group in [("none", "none", 128), ("int8", "int8", 128), ("int4 g128", "int4", 128),
                              ("int4 g32", "int4", 32), ("int4 g128 gptq", "gptq", 128),
                              ("mixed", "gptq", 128)]:
        shard = Shard.from_pretrained(demo_model, 0, 30)
        if mode == "gptq":
            int8 = MIXED_INT8 if name == "mixed" else ()
            calibrate_shard(shard, *calibration_batch(head, calib_ids, 512), group, int8=int8)
        else:
            quantize_shard(shard, mode, group)
        ppl[name] = _perplexity(shard, head, ids)
    print(f"\nSmolLM2-135M perplexity, first {PPL_TOKENS} tokens of {TEXT} (GPTQ calibrated on {CALIBRATION}): {ppl}")
    # Measured 2026-11-30 (this test, 2 torch threads): none 19.30, int8 19.39 (+0.5%), int4 g128
    # 32.06 (+66%), int4 g32 19.28 (-0.1%), int4 g128 GPTQ 24.88 (+29%), mixed (wqkv, wo, w_down
    # int8; w_gate_up GPTQ int4 g128) 20.12 (+4.2%). The same GPTQ in a 1-thread process gave
    # 30.17 (+56%) and 20.57 (+6.6%): with 2048 calibration tokens the result swings with
    # floating-point noise (see docs/performance.md), hence the loose GPTQ bound. 2026-12-05, another
    # 2-core Xeon, 2 threads: int4 g128 GPTQ 33.76 (+75%, 1.05x round-to-nearest), mixed 19.99 (+3.6%).
    assert ppl["none"] < 20  # sanity: the model reads the license fine
    assert ppl["int8"] < ppl["none"] * 1.01
    assert ppl["int4 g32"] < ppl["none"] * 1.08
    assert ppl["int4 g128 gptq"] < ppl["int4 g128"] * 1.15
    assert ppl["mixed"] < ppl["none"] * 1.08
