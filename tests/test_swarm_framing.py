"""Framing: length-prefixed frames over asyncio streams, including hostile and truncated input."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.errors import ConnectionClosed, FrameTooLarge, ProtocolError
from swarm.framing import read_frame, write_frame


def reader_with(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=1 << 30)
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


async def test_round_trip_over_socketpair() -> None:
    a, b = socket.socketpair()
    ra, wa = await asyncio.open_connection(sock=a)
    rb, wb = await asyncio.open_connection(sock=b)
    try:
        payloads = [b"", b"x", bytes(range(256)) * 40_000]  # 10 MB: several socket buffers
        writer_task = asyncio.create_task(_write_all(wa, payloads))
        for p in payloads:
            assert await asyncio.wait_for(read_frame(rb, 1 << 24), 10) == p
        await writer_task
        wa.close()
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(read_frame(rb, 1 << 24), 10)
        assert info.value.clean
    finally:
        wa.close()
        wb.close()


async def _write_all(writer: asyncio.StreamWriter, payloads: list[bytes]) -> None:
    for p in payloads:
        await write_frame(writer, p)


async def test_too_large_is_refused_before_reading_payload() -> None:
    reader = reader_with(struct.pack(">I", 2**32 - 1) + b"abc", eof=False)
    with pytest.raises(FrameTooLarge) as info:
        await asyncio.wait_for(read_frame(reader, 1024), 1)
    assert info.value.declared == 2**32 - 1 and info.value.limit == 1024
    assert isinstance(info.value, ProtocolError) and info.value.code == "too_large"
    assert await reader.read(3) == b"abc"  # the payload was left untouched


async def test_frame_at_exact_limit_is_accepted() -> None:
    assert await read_frame(reader_with(frame(b"12345")), 5) == b"12345"
    with pytest.raises(FrameTooLarge):
        await read_frame(reader_with(frame(b"123456")), 5)


@pytest.mark.parametrize("data, clean", [(b"", True), (b"\x00\x00", False), (frame(b"hello")[:-2], False)])
async def test_eof_is_connection_closed(data: bytes, clean: bool) -> None:
    with pytest.raises(ConnectionClosed) as info:
        await read_frame(reader_with(data), 1024)
    assert info.value.clean is clean
    assert isinstance(info.value, ConnectionError)


@settings(max_examples=300, deadline=2000)
@given(st.binary(max_size=512), st.integers(0, 300))
def test_random_streams_end_in_frames_or_errors(data: bytes, max_bytes: int) -> None:
    async def consume() -> None:
        reader = reader_with(data)
        consumed = 0
        while True:
            try:
                payload = await read_frame(reader, max_bytes)
            except FrameTooLarge as e:
                assert e.declared > max_bytes
                return
            except ConnectionClosed as e:
                assert e.clean == (consumed == len(data))
                return
            assert len(payload) <= max_bytes
            consumed += 4 + len(payload)

    asyncio.run(asyncio.wait_for(consume(), 5))  # never hangs: the reader always ends in EOF
