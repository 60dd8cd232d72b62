"""Quantized checkpoints: a checkpoint folder whose decoder layers are already int8/int4.

Written by `swarm-peer quantize` (after calibration) and read by `Shard.from_pretrained`, so a
peer loads the small quantized tensors directly. The folder is a normal checkpoint otherwise
(config.json, tokenizer files, embeddings / final norm / LM head unchanged), so a client can use
it as its model folder too. Beside `model.safetensors` lies `quantization.json`:

    {"format": "layerswarm-quant", "version": 1, "quant": "int4", "group_size": 128,
     "method": "gptq", "linears": {"wqkv": "int4", "wo": "int4", "w_gate_up": "int4", "w_down": "int4"},
     "calibration": {...free-form: text file, tokens...}}

Tensors of layer i: `model.layers.{i}.input_layernorm.weight`, `...post_attention_layernorm.weight`
(float), and per fused linear `model.layers.{i}.{wqkv|wo|w_gate_up|w_down}.{qweight, scale | scales,
mins}` in the `kernels.quant_matmul` formats, plus `model.layers.{i}.wqkv.bias` when the model has one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from shards.config import ModelConfig
from shards.errors import CheckpointError
from shards.quant import INT4_GROUP_SIZES, LINEAR_NAMES, QUANT_TENSORS, QuantLinear

FORMAT_FILE = "quantization.json"
FORMAT_NAME = "layerswarm-quant"
FORMAT_VERSION = 1
NORMS = {"input_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm"}


@dataclass(frozen=True)
class QuantFormat:
    quant: str  # the lowest precision of any linear: what the peer announces
    group_size: int
    method: str  # "gptq" (calibrated) or "rtn" (round to nearest)
    linears: dict[str, str]  # fused linear name -> "int8" | "int4"
    calibration: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, **asdict(self)}, indent=1)


def read_quant_format(folder: str | Path) -> QuantFormat | None:
    """The folder's quantization.json, or None for an ordinary (unquantized) checkpoint."""
    file = Path(folder) / FORMAT_FILE
    if not file.is_file():
        return None
    try:
        raw = json.loads(file.read_text())
        if raw.get("format") != FORMAT_NAME or raw.get("version") != FORMAT_VERSION:
            raise ValueError(f"format {raw.get('format')!r} version {raw.get('version')!r} is not "
                             f"{FORMAT_NAME!r} version {FORMAT_VERSION}")
        fmt = QuantFormat(quant=raw["quant"], group_size=int(raw["group_size"]), method=str(raw["method"]),
                          linears=dict(raw["linears"]), calibration=dict(raw.get("calibration", {})))
        if set(fmt.linears) != set(LINEAR_NAMES) or not set(fmt.linears.values()) <= {"int8", "int4"}:
            raise ValueError(f"linears must map {', '.join(LINEAR_NAMES)} to int8 or int4")
        if fmt.quant not in fmt.linears.values() or fmt.group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"quant {fmt.quant!r} / group_size {fmt.group_size} do not match the linears")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{file}: unreadable quantization description ({e}); re-run swarm-peer quantize") from None
    return fmt


def tensor_names(config: ModelConfig, layer: int, fmt: QuantFormat) -> list[str]:
    """Names of the tensors of one quantized layer (what loading must find)."""
    p = f"model.layers.{layer}."
    names = [p + f"{hf}.weight" for hf in NORMS.values()]
    for name in LINEAR_NAMES:
        names += [p + f"{name}.{t}" for t in QUANT_TENSORS[fmt.linears[name]]]
    if config.attention_bias:
        names.append(p + "wqkv.bias")
    return names


def block_tensors(block: nn.Module, layer: int) -> dict[str, torch.Tensor]:
    """A quantized DecoderBlock's tensors under their checkpoint names (norms in float32)."""
    p = f"model.layers.{layer}."
    out = {p + f"{hf}.weight": getattr(block, ours).weight.detach().float().contiguous() for ours, hf in NORMS.items()}
    for name in LINEAR_NAMES:
        lin = getattr(block, name)
        if not isinstance(lin, QuantLinear):
            raise ValueError(f"layer {layer} {name} is not quantized")
        for t in QUANT_TENSORS[lin.mode]:
            out[p + f"{name}.{t}"] = getattr(lin, t).contiguous()
        if lin.bias is not None:
            out[p + f"{name}.bias"] = lin.bias.detach().float().contiguous()
    return out


def load_block(block: nn.Module, config: ModelConfig, layer: int, tensors: dict[str, torch.Tensor],
               fmt: QuantFormat, dtype: torch.dtype) -> None:
    """Fill a (meta) DecoderBlock from its checkpoint tensors: QuantLinears and norms in `dtype`."""
    p = f"model.layers.{layer}."
    for ours, hf in NORMS.items():
        getattr(block, ours).weight = nn.Parameter(tensors[p + f"{hf}.weight"].to(dtype), requires_grad=False)
    for name in LINEAR_NAMES:
        meta = getattr(block, name)
        mode = fmt.linears[name]
        qt = {t: tensors[p + f"{name}.{t}"] for t in QUANT_TENSORS[mode]}
        bias = tensors.get(p + f"{name}.bias")
        ql = QuantLinear(mode, meta.in_features, meta.out_features, qt,
                         bias.to(dtype) if bias is not None else None, fmt.group_size)
        _check_shapes(ql, fmt.group_size, f"{p}{name}")
        setattr(block, name, ql)


def _check_shapes(ql: QuantLinear, group_size: int, where: str) -> None:
    """A tensor of the wrong shape or dtype fails here, naming itself, not inside a kernel later."""
    N, K = ql.out_features, ql.in_features
    if ql.mode == "int8":
        ok = ql.qweight.shape == (N, K) and ql.qweight.dtype == torch.int8 and ql.scale.shape == (N,)
    else:
        ng = -(-K // group_size)
        ok = (ql.qweight.shape == (N, ng * group_size // 2) and ql.qweight.dtype == torch.uint8
              and ql.scales.shape == ql.mins.shape == (ng, N))
    if not ok:
        raise CheckpointError(f"{where}: quantized tensors have the wrong shape or dtype for a {N}x{K} {ql.mode} "
                              "linear; the checkpoint is corrupt or from another model")
