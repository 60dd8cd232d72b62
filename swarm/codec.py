"""Wire codec: msgpack messages and tensors, decoded defensively.

Every message is a msgpack map with a str "type". Tensors travel as
`{"dtype": str, "shape": [int, ...], "data": bytes}` in little-endian row-major order.
Everything is checked before anything is allocated, so a hostile frame costs at most
the frame itself. Never pickle: the other side is untrusted.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import msgpack
import torch

from swarm.errors import ProtocolError

if sys.byteorder != "little":  # the wire format is little-endian and we send raw storage bytes
    raise ImportError("swarm.codec assumes a little-endian host")

# dtype name on the wire -> (torch dtype, the dtype used to build it from raw bytes).
# bfloat16 is built through an int16 view: that keeps us on plain integer buffers.
DTYPES: dict[str, tuple[torch.dtype, torch.dtype]] = {
    "float32": (torch.float32, torch.float32),
    "float16": (torch.float16, torch.float16),
    "bfloat16": (torch.bfloat16, torch.int16),
    "int64": (torch.int64, torch.int64),
    "int32": (torch.int32, torch.int32),
}
ITEMSIZE: dict[str, int] = {
    name: torch.empty((), dtype=buf).element_size() for name, (_, buf) in DTYPES.items()
}
DTYPE_NAMES: dict[torch.dtype, str] = {torch_dtype: name for name, (torch_dtype, _) in DTYPES.items()}
MAX_TENSOR_DIMS = 4


@dataclass(frozen=True)
class Limits:
    """What a receiver is willing to accept. Defaults fit a 64M-element activation batch."""

    max_frame_bytes: int = 256 * 2**20
    max_tensor_elements: int = 64 * 2**20


def encode_message(msg: dict[str, Any]) -> bytes:
    """Serialize a message dict (must carry a str "type") to a frame payload."""
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise TypeError(f"a message must be a dict with a str 'type', got {msg!r:.200}")
    return msgpack.packb(msg, use_bin_type=True)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError("bad_message", f"msgpack extension type {code} is not allowed")


def decode_message(payload: bytes, limits: Limits) -> dict[str, Any]:
    """Parse a frame payload into a message dict; anything malformed raises ProtocolError."""
    if len(payload) > limits.max_frame_bytes:
        raise ProtocolError("too_large", f"payload of {len(payload)} bytes exceeds {limits.max_frame_bytes}")
    try:
        # The *_len caps stop a tiny payload from declaring a huge container.
        # A container can never have more entries than the payload has bytes.
        cap = max(len(payload), 1)
        msg = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_refuse_ext,
            max_str_len=cap,
            max_bin_len=cap,
            max_array_len=cap,
            max_map_len=cap,
            max_ext_len=0,
        )
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises many types (ExtraData, ValueError, StackError, ...)
        raise ProtocolError("bad_message", f"undecodable msgpack payload: {type(e).__name__}: {e}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_message", f"a message must be a map, got {type(msg).__name__}")
    if not isinstance(msg.get("type"), str):
        raise ProtocolError("bad_message", "a message needs a str field 'type'")
    return msg


def encode_tensor(t: torch.Tensor) -> dict[str, Any]:
    """Tensor -> wire dict. Copies once (to contiguous bytes); works for any device."""
    name = DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise TypeError(f"dtype {t.dtype} cannot be sent; allowed: {', '.join(DTYPES)}")
    if t.dim() > MAX_TENSOR_DIMS:
        raise ValueError(
            f"tensors of more than {MAX_TENSOR_DIMS} dims cannot be sent, got shape {tuple(t.shape)}"
        )
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {"dtype": name, "shape": list(t.shape), "data": data}


def decode_tensor(obj: Any, limits: Limits) -> torch.Tensor:
    """Wire dict -> a writable CPU tensor that owns its memory. Checks everything before allocating."""
    if not isinstance(obj, dict):
        raise ProtocolError("bad_tensor", f"a tensor must be a map, got {type(obj).__name__}")
    name, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("data")
    if not isinstance(name, str) or name not in DTYPES:
        raise ProtocolError("bad_tensor", f"dtype {name!r:.40} is not allowed; allowed: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_TENSOR_DIMS:
        raise ProtocolError(
            "bad_tensor", f"shape must be a list of at most {MAX_TENSOR_DIMS} ints, got {shape!r:.80}"
        )
    # bool is an int subclass: refuse it so True never means 1
    if not all(type(d) is int and d >= 0 for d in shape):
        raise ProtocolError("bad_tensor", f"shape must hold non-negative ints, got {shape!r:.80}")
    numel = math.prod(shape)
    if numel > limits.max_tensor_elements:
        raise ProtocolError("too_large", f"tensor of {numel} elements exceeds {limits.max_tensor_elements}")
    if not isinstance(data, (bytes, bytearray)):
        raise ProtocolError("bad_tensor", f"tensor data must be bytes, got {type(data).__name__}")
    torch_dtype, buffer_dtype = DTYPES[name]
    itemsize = ITEMSIZE[name]
    if len(data) != numel * itemsize:
        raise ProtocolError(
            "bad_tensor", f"{name} tensor of shape {shape} needs {numel * itemsize} bytes, got {len(data)}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=torch_dtype)
    # bytearray copies the bytes once: the tensor then owns writable memory and does not
    # alias the (immutable, shared) frame buffer.
    flat = torch.frombuffer(bytearray(data), dtype=buffer_dtype)
    return flat.view(torch_dtype).reshape(shape)
