"""Calibrated int4 (GPTQ), `swarm-peer quantize` checkpoints, and clients that require a minimum
precision (`min_quant`) in a swarm of peers with mixed quantization."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import DistributedModel
from client.config import ClientConfig
from client.local_swarm import LocalSwarm
from kernels.quant_matmul import dequantize_int4, quantize_int4
from routing import NoRouteError
from shards import BatchLayout, Shard
from shards.calibrate import calibrate_shard, gptq_int4
from shards.quant import QuantLinear, quantize_shard
from tests.kernel_helpers import random_shard, rel_err, tiny_config

TEXT = Path(__file__).with_name("test_quant_checkpoint.py")  # any English-ish text works for a tiny model


def test_gptq_output_error_below_round_to_nearest() -> None:
    """On correlated inputs (like real activations) GPTQ's outputs are closer than RTN's."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 320, generator=gen) * 0.05
    x = torch.randn(2048, 64, generator=gen) @ torch.randn(64, 320, generator=gen)  # rank-64 inputs
    x += 0.05 * torch.randn(2048, 320, generator=gen)
    q, s, m = gptq_int4(w, x.t() @ x, 64)
    q_rtn, s_rtn, m_rtn = quantize_int4(w, 64)
    assert q.shape == q_rtn.shape and s.shape == s_rtn.shape and s.dtype == torch.bfloat16
    ref = x @ w.t()
    err_gptq = rel_err(x @ dequantize_int4(q, s, m, 320).t(), ref)
    err_rtn = rel_err(x @ dequantize_int4(q_rtn, s_rtn, m_rtn, 320).t(), ref)
    assert err_gptq < 0.7 * err_rtn, (err_gptq, err_rtn)


def test_calibrated_shard_closer_than_round_to_nearest() -> None:
    cfg = tiny_config(2, attention_bias=True)
    ref, gptq, rtn = (random_shard(cfg, torch.float32, "cpu", seed=5) for _ in range(3))
    torch.manual_seed(0)
    mix = torch.randn(32, cfg.hidden_size)
    calib = torch.randn(4 * 64, 32) @ mix  # correlated hidden states
    calibrate_shard(gptq, calib, BatchLayout([64] * 4, [0] * 4, None), 64)
    quantize_shard(rtn, "int4", 64)
    assert gptq.quant == "int4" and isinstance(gptq.blocks[0].wqkv, QuantLinear)
    assert gptq.blocks[0].wqkv.bias is not None
    h = torch.randn(3 * 40, 32) @ mix  # fresh text from the same distribution
    lay = BatchLayout([40] * 3, [0] * 3, None)
    want = ref(h, lay, None)
    assert rel_err(gptq(h, lay, None), want) < rel_err(rtn(h, lay, None), want)


def test_mixed_mode_keeps_named_linears_int8() -> None:
    cfg = tiny_config(2)
    shard = random_shard(cfg, torch.float32, "cpu", seed=6)
    calib = torch.randn(2 * 32, cfg.hidden_size)
    calibrate_shard(shard, calib, BatchLayout([32, 32], [0, 0], None), 64, int8=("wqkv", "w_down"))
    modes = {n: getattr(shard.blocks[1], n).mode for n in ("wqkv", "wo", "w_gate_up", "w_down")}
    assert modes == {"wqkv": "int8", "wo": "int4", "w_gate_up": "int4", "w_down": "int8"}


def _word_tokenizer(model: Path, text: str, vocab_size: int) -> None:
    """Give a tiny checkpoint a whitespace word-level tokenizer (its own vocab is only ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [w for w, _ in Counter(text.split()).most_common(vocab_size - 1)]
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(model)


def _quantize_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "peer.cli", "quantize", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def calibrated_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, GPTQ-calibrated to int4 by `swarm-peer quantize`."""
    src = tmp_path_factory.mktemp("tiny-tok") / "tiny"
    shutil.copytree(tiny_model, src)
    _word_tokenizer(src, TEXT.read_text(), 320)
    out = tmp_path_factory.mktemp("tiny-int4") / "tiny-int4"
    res = _quantize_cli("--model", str(src), "--out", str(out), "--calibration", str(TEXT),
                        "--calibration-tokens", "256", "--seq-len", "64", "--group-size", "64")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == str(out)
    assert "quantizing to int4" in res.stderr  # the progress bar
    return out


def test_quantize_cli_writes_a_checkpoint_that_loads(calibrated_model: Path, tiny_model: Path) -> None:
    fmt = json.loads((calibrated_model / "quantization.json").read_text())
    assert fmt["quant"] == "int4" and fmt["method"] == "gptq" and fmt["group_size"] == 64
    assert fmt["calibration"]["tokens"] == 256
    shard = Shard.from_pretrained(calibrated_model, 0, 4)
    assert shard.quant == "int4" and isinstance(shard.blocks[3].w_down, QuantLinear)
    ref = Shard.from_pretrained(tiny_model, 0, 4)
    h = torch.randn(9, ref.config.hidden_size)
    lay = BatchLayout([9], [0], None)
    assert rel_err(shard(h, lay, None), ref(h, lay, None)) < 0.3  # int4 of a 64-wide model; a layout bug gives ~1


def test_quantize_cli_refuses_with_one_line(calibrated_model: Path, tiny_model: Path, tmp_path: Path) -> None:
    res = _quantize_cli("--model", str(tiny_model), "--out", str(calibrated_model))  # not empty
    assert res.returncode == 2 and "exists and is not empty" in res.stderr and "Traceback" not in res.stderr
    res = _quantize_cli("--model", str(tiny_model), "--out", str(tmp_path / "x"), "--calibration", str(TEXT))
    assert res.returncode == 2 and "tokenizer" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "x").exists()  # nothing half-written is left behind
    res = subprocess.run([sys.executable, "-m", "peer.cli", "serve", "--model", str(calibrated_model), "--layers",
                          "0:4", "--quant", "int8"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "already quantized to int4" in res.stderr


def test_min_quant_is_validated() -> None:
    with pytest.raises(ValueError, match="min_quant"):
        ClientConfig(min_quant="int3")
    assert ClientConfig(min_quant="int8").accepts_quant("none")
    assert not ClientConfig(min_quant="int8").accepts_quant("int4")
    assert not ClientConfig(min_quant="int8").accepts_quant("fp3")  # unknown kinds are not trusted
    assert ClientConfig().accepts_quant("int4")


@pytest.mark.slow
def test_min_quant_routes_around_coarser_peers(calibrated_model: Path, tiny_model: Path,
                                               local_swarm: LocalSwarm) -> None:
    """An int4 peer (pre-quantized checkpoint) and an int8 peer serve the same layers: a client
    with min_quant="int8" uses only the int8 one; with "none" no route exists, said in one line."""
    local_swarm.start_dht()
    local_swarm.start_peer(calibrated_model, "0:4", "--model-name", "tiny")
    local_swarm.start_peer(tiny_model, "0:4", "--quant", "int8", "--model-name", "tiny")
    int4_peer, int8_peer = local_swarm.processes[-2:]
    ids = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(2))
    expected = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)(ids).logits
    with DistributedModel.from_pretrained(tiny_model, local_swarm.initial_peers, model_name="tiny",
                                           min_quant="int8") as model:
        view = model.loop.run(model.swarm.view(fresh=True), timeout=30)
        assert view.records[int4_peer.peer_id].quant == "int4"
        assert view.records[int8_peer.peer_id].quant == "int8"
        for _ in range(5):  # routes are drawn at random among good ones: never the int4 peer
            route = model.loop.run(model.swarm.plan(0, 4, fresh=True), timeout=30)
            assert [hop.peer_id for hop in route] == [int8_peer.peer_id]
        logits = model(ids).logits
    assert (logits - expected).abs().max() / expected.abs().max() < 0.05
    with DistributedModel.from_pretrained(tiny_model, local_swarm.initial_peers, model_name="tiny",
                                           min_quant="none") as model:
        with pytest.raises(NoRouteError, match="min_quant=none"):
            model.loop.run(model.swarm.plan(0, 4, fresh=True), timeout=30)
