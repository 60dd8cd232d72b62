"""Length-prefixed frames over an asyncio byte stream.

A frame is a 4-byte big-endian unsigned length followed by that many payload bytes.
libp2p binary streams are plain byte pipes, so this is what turns them into messages.

A frame's payload is buffered whole before it is decoded, so a reader bounds what a remote
side can make it hold: the declared length is checked before any payload byte is read, the
payload must arrive within a deadline once the header did, and the bytes of partly read
frames from one remote peer share a `ByteBudget` (a stalled frame waits for room, then times out).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from swarm.errors import ConnectionClosed, FrameTimeout, FrameTooLarge

HEADER = struct.Struct(">I")
MAX_WIRE_FRAME = 2**32 - 1  # what a 4-byte length can express


class ByteBudget:
    """Bytes that the frames being read from one remote peer may hold at once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._freed = asyncio.Condition()

    @asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        async with self._freed:
            await self._freed.wait_for(lambda: self.used + n <= self.capacity)
            self.used += n
        try:
            yield
        finally:
            async with self._freed:
                self.used -= n
                self._freed.notify_all()


async def read_frame(
    reader: asyncio.StreamReader, max_bytes: int, *, payload_timeout: Callable[[int], float] | None = None,
    budget: ByteBudget | None = None,
) -> bytes:
    """Read one frame; the declared length is checked against `max_bytes` before reading the payload.

    Waiting for a header is unbounded (an idle session is fine); once it arrived, room in
    `budget` and the whole payload must come within `payload_timeout(length)` seconds, else
    FrameTimeout and the stream is unusable (it stopped mid-frame).
    """
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            raise ConnectionClosed("stream closed at a frame boundary", clean=True) from None
        raise ConnectionClosed(
            f"stream closed inside a frame header ({len(e.partial)}/4 bytes)", clean=False
        ) from None
    (length,) = HEADER.unpack(header)
    if length > max_bytes or (budget is not None and length > budget.capacity):
        # Refuse before readexactly: it would buffer `length` bytes, which is the attack.
        raise FrameTooLarge(length, max_bytes if budget is None else min(max_bytes, budget.capacity))
    seconds = payload_timeout(length) if payload_timeout is not None else None
    try:
        return await asyncio.wait_for(_read_payload(reader, length, budget), seconds)
    except asyncio.TimeoutError:
        raise FrameTimeout(length, seconds) from None
    except asyncio.IncompleteReadError as e:
        raise ConnectionClosed(
            f"stream closed inside a frame ({len(e.partial)}/{length} bytes)", clean=False
        ) from None


async def _read_payload(reader: asyncio.StreamReader, length: int, budget: ByteBudget | None) -> bytes:
    if budget is None:
        return await reader.readexactly(length)
    async with budget.hold(length):
        return await reader.readexactly(length)


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
