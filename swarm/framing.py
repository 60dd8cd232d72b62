"""Length-prefixed frames over an asyncio byte stream.

A frame is a 4-byte big-endian unsigned length followed by that many payload bytes.
libp2p binary streams are plain byte pipes, so this is what turns them into messages.
"""

from __future__ import annotations

import asyncio
import struct

from swarm.errors import ConnectionClosed, FrameTooLarge

HEADER = struct.Struct(">I")
MAX_WIRE_FRAME = 2**32 - 1  # what a 4-byte length can express


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """Read one frame; the declared length is checked against `max_bytes` before reading the payload."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            raise ConnectionClosed("stream closed at a frame boundary", clean=True) from None
        raise ConnectionClosed(
            f"stream closed inside a frame header ({len(e.partial)}/4 bytes)", clean=False
        ) from None
    (length,) = HEADER.unpack(header)
    if length > max_bytes:
        # Refuse before readexactly: it would buffer `length` bytes, which is the attack.
        raise FrameTooLarge(length, max_bytes)
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as e:
        raise ConnectionClosed(
            f"stream closed inside a frame ({len(e.partial)}/{length} bytes)", clean=False
        ) from None


async def write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    """Write one frame and wait for the transport to drain.

    Header and payload are written without an await between them, so concurrent tasks
    writing frames to the same writer never interleave bytes of two frames.
    """
    if len(payload) > MAX_WIRE_FRAME:
        raise FrameTooLarge(len(payload), MAX_WIRE_FRAME)
    writer.write(HEADER.pack(len(payload)))
    writer.write(payload)  # separate write: no copy of a large payload into header+payload
    try:
        await writer.drain()
    except (ConnectionResetError, BrokenPipeError) as e:
        raise ConnectionClosed(f"stream closed while writing: {e}", clean=False) from e
