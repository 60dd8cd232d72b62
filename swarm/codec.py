"""Wire codec: msgpack messages and tensors, decoded defensively.

Every message is a msgpack map with a str "type". Tensors travel as
`{"dtype": str, "shape": [int, ...], "data": bytes}` in little-endian row-major order.
Everything is checked before anything is allocated, so a hostile frame costs at most
the frame itself plus a bounded number of Python objects: container lengths, the number of
containers and items, nesting depth and string lengths each have their own limit (an 8 MiB
frame of empty maps used to cost 587 MiB). Never pickle: the other side is untrusted.
"""

from __future__ import annotations

import math
import reprlib
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


FRAME_OVERHEAD = 8 * 2**20  # room beside the largest tensor: token ids (<= 5 bytes each), fields


@dataclass(frozen=True)
class Limits:
    """What a receiver is willing to accept, in bytes, objects and seconds.

    The default frame fits the largest legitimate message: a tensor of `max_tensor_elements`
    float32 values plus FRAME_OVERHEAD for the other fields (token ids of every row).
    """

    max_frame_bytes: int = 64 * 2**20 * ITEMSIZE["float32"] + FRAME_OVERHEAD
    max_tensor_elements: int = 64 * 2**20
    # Object limits, separate from bytes: a byte of msgpack can be a whole Python object.
    max_array_len: int = 2**20  # one list (token ids of one sequence is the longest legitimate one)
    max_map_len: int = 256  # keys of one map
    max_str_len: int = 2**16  # chars of one string (error messages are the longest legitimate ones)
    max_containers: int = 4096  # maps + lists in one message
    max_items: int = 2**21  # list entries + map entries in one message: ~60 bytes of Python each at most
    max_depth: int = 16  # nesting of maps and lists
    # Time and per-remote limits, applied by swarm.framing / swarm.connection.
    frame_timeout: float = 60.0  # seconds for a frame's payload once its header arrived, plus...
    min_bytes_per_second: float = 2**20  # ...its length at this rate: a stalled frame cannot pin memory
    auth_frame_bytes: int = 4096  # the first frame from a not-yet-authenticated remote (private swarms)
    auth_timeout: float = 10.0
    max_streams_per_peer: int = 128  # concurrent streams one remote peer may hold open to us
    max_buffered_bytes_per_peer: int = 0  # bytes of partly read frames per remote; 0: max_frame_bytes

    def payload_timeout(self, length: int) -> float:
        return self.frame_timeout + length / self.min_bytes_per_second

    @property
    def peer_buffer_bytes(self) -> int:
        # One largest frame at a time per remote: an honest client's big frames (prefills) are
        # rare, and its small ones (decode steps) pass as soon as the big one is read.
        return self.max_buffered_bytes_per_peer or self.max_frame_bytes


_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother, _short.maxlist = 2, 40, 40, 6


def describe(value: Any) -> str:
    """A short repr of untrusted data: never recursive, never long (for error messages)."""
    try:
        return _short.repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


def encode_message(msg: dict[str, Any]) -> bytes:
    """Serialize a message dict (must carry a str "type") to a frame payload."""
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise TypeError(f"a message must be a dict with a str 'type', got {msg!r:.200}")
    return msgpack.packb(msg, use_bin_type=True)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError("bad_message", f"msgpack extension type {code} is not allowed")


class _Budget:
    """Counts containers and their entries as msgpack completes them; refuses past the limits.

    msgpack calls the hooks as each list/map is finished, so a refusal comes after at most
    `max_containers` containers (each at most max_array_len / max_map_len long) were built.
    """

    def __init__(self, limits: Limits) -> None:
        self.containers = limits.max_containers
        self.items = limits.max_items

    def _spend(self, entries: int) -> None:
        self.containers -= 1
        self.items -= entries
        if self.containers < 0 or self.items < 0:
            raise ProtocolError("too_large", "message holds too many maps, lists or entries")

    def on_list(self, value: list) -> list:
        self._spend(len(value))
        return value

    def on_map(self, value: dict) -> dict:
        self._spend(len(value))
        return value


def _check_depth(msg: Any, max_depth: int) -> None:
    """Iterative (never recursive) walk: refuse nesting deeper than `max_depth`."""
    stack = [(msg, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > max_depth:
                    raise ProtocolError("bad_message", f"message nested deeper than {max_depth} levels")
                stack.append((child, depth + 1))


def decode_message(payload: bytes, limits: Limits) -> dict[str, Any]:
    """Parse a frame payload into a message dict; anything malformed raises ProtocolError."""
    if len(payload) > limits.max_frame_bytes:
        raise ProtocolError("too_large", f"payload of {len(payload)} bytes exceeds {limits.max_frame_bytes}")
    budget = _Budget(limits)
    try:
        # The *_len caps stop a tiny payload from declaring a huge container; the budget hooks
        # bound how many containers and entries the whole message may build.
        msg = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_refuse_ext,
            list_hook=budget.on_list,
            object_hook=budget.on_map,
            max_str_len=limits.max_str_len,
            max_bin_len=max(len(payload), 1),
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=0,
        )
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises many types (ExtraData, ValueError, StackError, ...)
        raise ProtocolError("bad_message", f"undecodable msgpack payload: {type(e).__name__}: {e}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_message", f"a message must be a map, got {type(msg).__name__}")
    _check_depth(msg, limits.max_depth)
    if not isinstance(msg.get("type"), str):
        raise ProtocolError("bad_message", "a message needs a str field 'type'")
    return msg


# Float dtypes -> (integer view of the same width, exponent mask): a value is NaN or infinite
# exactly when all its exponent bits are set.
_EXPONENT_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float32: (torch.int32, 0x7F800000),
    torch.float16: (torch.int16, 0x7C00),
    torch.bfloat16: (torch.int16, 0x7F80),
}


def all_finite(t: torch.Tensor) -> bool:
    """True when no element of a float tensor is NaN or infinite.

    Every step's hidden states are checked on both ends of a hop, so this is on the decode path:
    on a host tensor it tests the exponent bits of an integer view in numpy (~5 us for a 4096-wide
    bf16 row, against ~16 us for a torch max-abs and ~28 us for torch.isfinite)."""
    view = _EXPONENT_BITS.get(t.dtype)
    if view is None or t.device.type != "cpu" or not t.is_contiguous():
        return bool(torch.isfinite(t).all())
    int_dtype, mask = view
    bits = t.view(int_dtype).numpy()
    return not bool(((bits & mask) == mask).any())


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
        raise ProtocolError("bad_tensor", f"dtype {describe(name)} is not allowed; allowed: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_TENSOR_DIMS:
        raise ProtocolError(
            "bad_tensor", f"shape must be a list of at most {MAX_TENSOR_DIMS} ints, got {describe(shape)}"
        )
    # bool is an int subclass: refuse it so True never means 1
    if not all(type(d) is int and d >= 0 for d in shape):
        raise ProtocolError("bad_tensor", f"shape must hold non-negative ints, got {describe(shape)}")
    # Each dim is bounded on its own: next to a zero dim, a dim >= 2**63 makes numel 0 but
    # overflows torch's int64 sizes.
    numel = math.prod(shape) if max(shape, default=0) <= limits.max_tensor_elements else limits.max_tensor_elements + 1
    if numel > limits.max_tensor_elements:
        raise ProtocolError("too_large", f"tensor of shape {describe(shape)} exceeds {limits.max_tensor_elements} elements")
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
