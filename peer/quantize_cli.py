"""`swarm-peer quantize`: write a quantized checkpoint once, so peers load small weights directly.

int4 is calibrated with GPTQ (`shards.calibrate`) on a short plain text, layer by layer (memory
stays near one layer plus the calibration activations); int8 rounds to nearest (already within
1% perplexity). The output folder is a complete checkpoint (`shards.quant_checkpoint`):
`swarm-peer serve --model OUT` serves it, and a client may use it as its model folder.

`checkpoint_quant` is the check `serve` makes: a quantized checkpoint fixes `--quant`.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Annotated

import typer

logger = logging.getLogger("swarm-peer")

# Plain English that ships with Debian/Ubuntu (base-files). It is NOT the text the project's
# perplexity test evaluates on (GPL-3), so measured gains are not calibration on the test set.
DEFAULT_CALIBRATION = Path("/usr/share/common-licenses/Apache-2.0")


def quantize(
    model: Annotated[Path, typer.Option("--model", help="Checkpoint folder to quantize (safetensors + config.json + tokenizer).")],
    out: Annotated[Path, typer.Option("--out", help="Folder to write the quantized checkpoint to (must not exist or be empty).")],
    quant: Annotated[str, typer.Option(help="int4 (group-wise, calibrated with GPTQ) or int8 (per channel, round to nearest).")] = "int4",
    group_size: Annotated[int, typer.Option(help="Group size of int4: 128, 64 or 32 (32: most accurate, no fast GPU kernel yet).")] = 128,
    calibration: Annotated[Path | None, typer.Option(help=f"Plain-text file to calibrate int4 on: a few KB of text like the model will see. Default: {DEFAULT_CALIBRATION}.")] = None,
    calibration_tokens: Annotated[int, typer.Option(help="Tokens of the calibration text to use (more: slower, slightly better).")] = 2048,
    seq_len: Annotated[int, typer.Option(help="Calibration sequence length (the text is cut into sequences of this many tokens).")] = 512,
    int8: Annotated[str, typer.Option("--int8", help="Mixed mode: these fused linears (comma-separated from wqkv, wo, w_gate_up, w_down) in int8 instead of int4, e.g. wqkv,wo,w_down.")] = "",
    rtn: Annotated[bool, typer.Option("--rtn", help="int4 without calibration (round to nearest): fast, much less accurate.")] = False,
    device: Annotated[str, typer.Option(help="cpu or cuda (cuda:N): where calibration runs.")] = "cpu",
    num_threads: Annotated[int, typer.Option(help="Torch CPU threads (0: torch's default).")] = 0,
    log_level: Annotated[str, typer.Option(help="Logging level on stderr.")] = "info",
) -> None:
    """Quantize a checkpoint's decoder layers to int4 (GPTQ-calibrated) or int8 and write it to --out."""
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if quant not in ("int8", "int4"):
        raise typer.BadParameter(f"{quant!r}: choose int4 or int8", param_hint="--quant")
    if group_size not in (32, 64, 128):
        raise typer.BadParameter("must be 32, 64 or 128", param_hint="--group-size")
    if not (model / "config.json").is_file():
        raise typer.BadParameter(f"{model} is not a checkpoint folder (no config.json)", param_hint="--model")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise typer.BadParameter(f"{out} exists and is not empty; remove it or choose another folder", param_hint="--out")
    if calibration_tokens < seq_len or seq_len < 16:
        raise typer.BadParameter(f"need --calibration-tokens >= --seq-len >= 16 (got {calibration_tokens}, {seq_len})")
    int8_linears = tuple(n for n in int8.replace(" ", "").split(",") if n)
    if not set(int8_linears) <= {"wqkv", "wo", "w_gate_up", "w_down"} or (int8_linears and quant != "int4"):
        raise typer.BadParameter("names from wqkv, wo, w_gate_up, w_down, with --quant int4", param_hint="--int8")
    if len(set(int8_linears)) == 4:
        raise typer.BadParameter("every linear in int8 is --quant int8", param_hint="--int8")
    calibrated = quant == "int4" and not rtn
    text_file = calibration or DEFAULT_CALIBRATION
    if calibrated and not text_file.is_file():
        raise typer.BadParameter(f"{text_file} not found; pass --calibration FILE (a few KB of plain text)",
                                 param_hint="--calibration")
    import torch

    if num_threads > 0:
        torch.set_num_threads(num_threads)
    from shards.errors import CheckpointError

    try:
        write_quantized(model, out, quant, group_size, text_file if calibrated else None, calibration_tokens,
                        seq_len, device, int8_linears)
    except (CheckpointError, ValueError) as e:
        shutil.rmtree(out, ignore_errors=True)
        raise typer.BadParameter(" ".join(str(e).split()), param_hint="--model") from None
    print(out, flush=True)


def write_quantized(model: Path, out: Path, quant: str, group_size: int, text_file: Path | None,
                    calibration_tokens: int, seq_len: int, device: str, int8: tuple[str, ...] = ()) -> None:
    """The work of `quantize` (no option checks): one layer at a time, then one safetensors file."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm

    from shards.block import DecoderBlock
    from shards.calibrate import calibrate_layer, calibration_batch
    from shards.config import ModelConfig
    from shards.families import block_class
    from shards.head import ModelHead
    from shards.loading import load_tensors, tensor_files
    from shards.quant import LINEAR_NAMES, QuantLinear
    from shards.quant_checkpoint import FORMAT_FILE, QuantFormat, block_tensors, read_quant_format
    from shards.shard import Shard

    config = ModelConfig.from_pretrained(model)
    if read_quant_format(model) is not None:
        raise ValueError(f"{model} is already quantized; quantize the original checkpoint")
    if any(block_class(config, i) is not DecoderBlock for i in range(config.num_layers)):
        raise ValueError(f"{config.model_type} layers are not supported by quantize yet (llama, mistral, qwen2 are); "
                         "serve the original with --quant instead")
    t0 = time.time()
    hidden = layout = None
    calib_info: dict = {}
    if text_file is not None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(model)
        except (OSError, ValueError) as e:
            raise ValueError(f"{model}: no usable tokenizer for the calibration text ({e})") from None
        ids = torch.tensor(tokenizer(text_file.read_text(errors="replace"))["input_ids"][:calibration_tokens])
        head = ModelHead.from_pretrained(model, device=device)
        hidden, layout = calibration_batch(head, ids, seq_len)
        del head
        calib_info = {"text": text_file.name, "tokens": hidden.shape[0], "seq_len": seq_len}
        logger.info("calibrating on %d tokens of %s (%d sequences)", hidden.shape[0], text_file, len(layout.new_tokens))
    tensors: dict[str, torch.Tensor] = {}
    for layer in tqdm(range(config.num_layers), desc=f"quantizing to {quant}", unit="layer"):
        shard = Shard.from_pretrained(model, layer, layer + 1, device=device)
        if hidden is not None:
            hidden = calibrate_layer(shard, layer, hidden, layout, group_size, int8)
        else:
            for name in LINEAR_NAMES:
                lin = getattr(shard.blocks[0], name)
                setattr(shard.blocks[0], name, QuantLinear.from_linear(lin, "int8" if name in int8 else quant, group_size))
        tensors.update({k: v.cpu() for k, v in block_tensors(shard.blocks[0], layer).items()})
        del shard
    files = tensor_files(model)
    rest = [n for n in files if not n.startswith("model.layers.")]  # embeddings, final norm, LM head
    tensors.update(load_tensors(files, rest, None, "cpu"))
    out.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():  # config, tokenizer, generation config: everything but the weights
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in ("model.safetensors.index.json", FORMAT_FILE):
            shutil.copy2(f, out / f.name)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    fmt = QuantFormat(quant=quant, group_size=group_size, method="gptq" if hidden is not None else "rtn",
                      linears={n: "int8" if n in int8 else quant for n in LINEAR_NAMES}, calibration=calib_info)
    (out / FORMAT_FILE).write_text(fmt.to_json())
    logger.info("wrote %s (%.0f MiB) in %.0f s", out, sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20,
                time.time() - t0)


def checkpoint_quant(model: Path, quant: str, group_size: int) -> tuple[str, int]:
    """`serve`'s --quant/--quant-group-size, fixed by a quantized checkpoint when --model is one."""
    from shards.errors import CheckpointError
    from shards.quant_checkpoint import read_quant_format

    try:
        fmt = read_quant_format(model)
    except CheckpointError as e:
        raise typer.BadParameter(str(e), param_hint="--model") from None
    if fmt is None:
        return quant, group_size
    if quant not in ("none", fmt.quant):
        raise typer.BadParameter(f"{model} is already quantized to {fmt.quant}; drop --quant {quant} (or serve the "
                                 "original checkpoint)", param_hint="--quant")
    return fmt.quant, fmt.group_size
