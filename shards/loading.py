"""Read only the tensors we need from a HF safetensors folder (single file or sharded + index).

Headers are parsed by hand (8-byte length + JSON) so a corrupt file fails with a
CheckpointError naming it, and so the fingerprint can hash metadata plus a few raw bytes per
tensor without reading whole tensors. Tensor data is read through `safetensors.safe_open`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open

from shards.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit
_SAMPLE_BYTES = 4096  # per tensor end, for the fingerprint


def read_header(file: Path) -> dict[str, dict]:
    """Tensor entries {name: {dtype, shape, data_offsets}} of one .safetensors file."""
    try:
        with open(file, "rb") as f:
            raw_len = f.read(8)
            (n,) = struct.unpack("<Q", raw_len) if len(raw_len) == 8 else (-1,)
            if not 0 < n <= _MAX_HEADER:
                raise ValueError(f"header length {n} is invalid")
            raw = f.read(n)
            if len(raw) != n:
                raise ValueError("file ends inside the header")
            header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{file}: corrupt or truncated safetensors header ({e}); re-download or re-convert this file"
        ) from None
    header.pop("__metadata__", None)
    return header


def data_start(file: Path) -> int:
    """Where the tensor data of a .safetensors file begins: its header's `data_offsets` count from here."""
    with open(file, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def tensor_files(folder: Path) -> dict[str, Path]:
    """Map every tensor name in the checkpoint to the file that holds it."""
    folder = Path(folder)
    index = folder / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index}: unreadable index ({e}); re-download the checkpoint") from None
        return {name: folder / file for name, file in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"{folder}: no *.safetensors files (nor {INDEX_NAME}); convert the checkpoint to safetensors "
            "(e.g. model.save_pretrained(folder, safe_serialization=True))"
        )
    return {name: file for file in files for name in read_header(file)}


def require(files: dict[str, Path], names: Iterable[str], folder: Path, what: str) -> None:
    """Raise CheckpointError naming the first missing tensor and where it was looked for."""
    for name in names:
        if name not in files:
            where = sorted({f.name for f in files.values()}) or ["<no files>"]
            raise CheckpointError(
                f"{folder}: tensor {name!r} (needed for {what}) is missing from {', '.join(where)}; "
                "the checkpoint is incomplete or not a supported architecture"
            )


def load_tensors(
    files: dict[str, Path], names: Iterable[str], dtype: torch.dtype, device: torch.device | str
) -> dict[str, torch.Tensor]:
    """Read just `names`, grouped by file so each file is opened once."""
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    out: dict[str, torch.Tensor] = {}
    for file, file_names in by_file.items():
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in file_names:
                    out[name] = f.get_tensor(name).to(device=device, dtype=dtype)
        except (OSError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"{file}: cannot read tensors ({e}); the file may be truncated or corrupt") from None
        except Exception as e:  # safetensors' own SafetensorError derives from Exception only
            if type(e).__name__ != "SafetensorError":
                raise
            raise CheckpointError(f"{file}: corrupt safetensors file ({e}); re-download or re-convert it") from None
    return out


def fingerprint(files: dict[str, Path], names: Iterable[str], extra: str) -> str:
    """sha256 over name, dtype, shape and the first/last bytes of each tensor, plus `extra`.

    Cheap (a few KiB read per tensor) yet it tells apart two fine-tunes of one architecture,
    which identical headers alone would not.
    """
    h = hashlib.sha256(extra.encode())
    headers: dict[Path, tuple[dict[str, dict], int]] = {}
    for name in sorted(names):
        file = files[name]
        if file not in headers:
            headers[file] = (read_header(file), data_start(file))
        header, base = headers[file]
        meta = header[name]
        h.update(f"{name}|{meta['dtype']}|{meta['shape']}|".encode())
        begin, end = meta["data_offsets"]
        with open(file, "rb") as f:
            for off in sorted({begin, max(begin, end - _SAMPLE_BYTES)}):
                f.seek(base + off)
                h.update(f.read(min(_SAMPLE_BYTES, end - off)))
    return h.hexdigest()
