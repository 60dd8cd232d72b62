"""The layerswarm/v1 wire format, written again from docs/protocol.md alone (no import of layerswarm).

Runs in the interop virtual environment (py-libp2p, numpy, msgpack), never beside hivemind.
A frame is a u32 big-endian length and a msgpack map with a str "type"; a tensor is a map
{dtype, shape, data} of raw little-endian row-major bytes.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import trio

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 2**20  # what we accept; the peer applies its own limits to what it receives
MAX_TENSOR_ELEMENTS = 64 * 2**20
MAX_DIMS = 4

# wire dtype name -> numpy dtype of its raw bytes (bfloat16 travels as its 16-bit pattern)
DTYPES = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2", "int64": "<i8", "int32": "<i4"}


class RemoteError(Exception):
    """An `error` frame from the peer: {code, message, retryable}."""

    def __init__(self, msg: dict[str, Any]) -> None:
        self.code = str(msg.get("code"))
        self.retryable = bool(msg.get("retryable"))
        super().__init__(f"{self.code}: {msg.get('message')} (retryable={self.retryable})")


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does (finite inputs: peers refuse NaN and infinity anyway)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def encode_tensor(array: np.ndarray, dtype: str) -> dict[str, Any]:
    """A float array -> the wire map in `dtype` (the peer's announced dtype for hidden states)."""
    if dtype == "bfloat16":
        raw = f32_to_bf16(array)
    else:
        raw = np.ascontiguousarray(array, dtype=DTYPES[dtype])
    return {"dtype": dtype, "shape": list(array.shape), "data": raw.tobytes()}


def decode_tensor(obj: Any) -> np.ndarray:
    """The wire map -> a float32 (or integer) array; every rule is checked before allocating."""
    if not isinstance(obj, dict):
        raise ValueError("a tensor must be a map")
    name, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("data")
    if name not in DTYPES:
        raise ValueError(f"tensor dtype {name!r} is not one of {sorted(DTYPES)}")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(type(d) is int and d >= 0 for d in shape)):
        raise ValueError(f"bad tensor shape {shape!r}")
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if numel > MAX_TENSOR_ELEMENTS:
        raise ValueError(f"tensor of {numel} elements is above {MAX_TENSOR_ELEMENTS}")
    raw_dtype = np.dtype(DTYPES[name])
    if not isinstance(data, bytes) or len(data) != numel * raw_dtype.itemsize:
        raise ValueError(f"{name} tensor of shape {shape} needs {numel * raw_dtype.itemsize} bytes")
    array = np.frombuffer(data, dtype=raw_dtype).reshape(shape)
    if name == "bfloat16":
        return bf16_to_f32(array)
    return array.astype(np.float32) if name in ("float16", "float32") else array.copy()


class MessageStream:
    """Whole messages over one py-libp2p stream (trio; anything with async read(n) / write(bytes) / close())."""

    def __init__(self, stream: Any, timeout: float = 60.0) -> None:
        self.stream = stream
        self.timeout = timeout  # seconds for one request's reply: a stuck peer fails the client, never hangs it

    async def _read_exactly(self, n: int) -> bytes:
        chunks, missing = [], n
        while missing:
            chunk = await self.stream.read(missing)
            if not chunk:
                raise EOFError(f"stream closed with {missing} of {n} bytes missing")
            chunks.append(chunk)
            missing -= len(chunk)
        return b"".join(chunks)

    async def send(self, msg: dict[str, Any]) -> None:
        payload = msgpack.packb(msg, use_bin_type=True)
        await self.stream.write(HEADER.pack(len(payload)) + payload)

    async def recv(self) -> dict[str, Any]:
        """The next message; an `error` frame is raised as RemoteError."""
        (length,) = HEADER.unpack(await self._read_exactly(HEADER.size))
        if length > MAX_FRAME_BYTES:
            raise ValueError(f"frame of {length} bytes is above our limit {MAX_FRAME_BYTES}")
        msg = msgpack.unpackb(await self._read_exactly(length), raw=False, strict_map_key=True)
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            raise ValueError("a message must be a map with a str 'type'")
        if msg["type"] == "error":
            raise RemoteError(msg)
        return msg

    async def request(self, msg: dict[str, Any], expect: str) -> dict[str, Any]:
        """Send, then read the reply, which must have type `expect`."""
        with trio.fail_after(self.timeout):
            await self.send(msg)
            reply = await self.recv()
        if reply["type"] != expect:
            raise ValueError(f"expected a {expect!r} reply to {msg['type']!r}, got {reply['type']!r}")
        return reply

    async def close(self) -> None:
        await self.stream.close()
