"""One protocol stream between two peers: send/recv whole messages, serve a handler.

A `PeerStream` wraps the (reader, writer) pair of a libp2p binary stream. Both sides use
it: the caller gets one from `open_stream`, a handler builds one from its arguments.
All methods must run on the event loop that owns the P2P object that made the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from typing import Any

from swarm.auth import SwarmKey
from swarm.codec import Limits, decode_message, encode_message
from swarm.errors import (
    ConnectionClosed,
    FrameTimeout,
    FrameTooLarge,
    PeerUnreachable,
    ProtocolError,
    RemoteError,
)
from swarm.framing import ByteBudget, read_frame, write_frame
from swarm.messages import AUTH, AUTHORIZED, ERROR, PROTOCOL_NAME
from swarm.schema import Info

logger = logging.getLogger(__name__)

LINGER_SECONDS = 2.0  # how long a refused stream stays open for its error frame to arrive


class PeerStream:
    """Message-level view of one stream. One reader task at a time; any number of senders."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        limits: Limits,
        remote_peer_id: str = "",
        budget: ByteBudget | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.limits = limits
        self.remote_peer_id = remote_peer_id
        self.budget = budget  # shared by all streams from this remote peer (server side)
        self._broken: str | None = None  # why the stream can no longer be read in sync

    @property
    def closed(self) -> bool:
        return self._broken is not None

    async def send(self, msg: dict[str, Any]) -> None:
        if self._broken is not None:
            raise ConnectionClosed(f"stream to {self.remote_peer_id} unusable: {self._broken}", clean=False)
        await write_frame(self.writer, encode_message(msg))

    async def send_error(self, error: ProtocolError) -> None:
        await self.send(error.to_message())

    async def recv_raw(self, timeout: float | None = None, max_bytes: int | None = None) -> dict[str, Any]:
        """Next message, including `error` frames as plain dicts (`max_bytes`: a tighter frame limit)."""
        if self._broken is not None:
            raise ConnectionClosed(f"stream to {self.remote_peer_id} unusable: {self._broken}", clean=False)
        limit = self.limits.max_frame_bytes if max_bytes is None else max_bytes
        try:
            payload = await asyncio.wait_for(
                read_frame(self.reader, limit, payload_timeout=self.limits.payload_timeout, budget=self.budget),
                timeout,
            )
        except asyncio.TimeoutError:
            # A read cancelled mid-frame leaves the stream at an unknown offset: never read it again.
            self._broken = f"timed out after {timeout} s"
            raise
        except FrameTooLarge:
            self._broken = "peer sent a frame above our limit"  # its payload is still in the pipe
            raise
        except FrameTimeout:
            self._broken = "peer stopped sending in the middle of a frame"
            raise
        except ConnectionClosed as e:
            self._broken = str(e)
            raise
        return decode_message(payload, self.limits)

    async def recv(self, timeout: float | None = None) -> dict[str, Any]:
        """Next message; an `error` frame from the remote side is raised as RemoteError."""
        msg = await self.recv_raw(timeout)
        if msg["type"] == ERROR:
            raise RemoteError(
                str(msg.get("code", "unknown")),
                str(msg.get("message", "")),
                bool(msg.get("retryable", False)),
                peer_id=self.remote_peer_id,
            )
        return msg

    async def request(self, msg: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """send + recv, for strictly one-reply-per-request exchanges."""
        await self.send(msg)
        return await self.recv(timeout)

    async def close(self) -> None:
        self._broken = self._broken or "closed locally"
        self.writer.close()
        with suppress(Exception):
            await self.writer.wait_closed()


async def open_stream(
    p2p: Any, peer_id: str, limits: Limits, name: str = PROTOCOL_NAME, swarm_key: SwarmKey | None = None,
    timeout: float = 30.0,
) -> PeerStream:
    """Open a `layerswarm/v1` stream to `peer_id` (base58) through a hivemind P2P object.

    With `swarm_key` (a private swarm), the stream starts with the `auth` handshake.
    """
    from hivemind.p2p import PeerID  # local import: only callers that open streams need hivemind

    try:
        _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), name)
    except Exception as e:  # p2pd's ControlFailure (dial failed, no handler) and friends
        raise PeerUnreachable(f"cannot open a stream to {peer_id}: {e}") from e
    stream = PeerStream(reader, writer, limits, remote_peer_id=peer_id)
    if swarm_key is not None:
        proof = swarm_key.stream_proof(peer_id, p2p.peer_id.to_base58())
        try:
            await stream.request({"type": AUTH, "proof": proof}, timeout)
        except BaseException:
            await stream.close()
            raise
    return stream


async def answers(
    p2p: Any, peer_id: str, limits: Limits, swarm_key: SwarmKey | None = None, timeout: float = 3.0,
) -> bool:
    """Does `peer_id` answer an `info` request within `timeout` s? An error frame is an answer.

    A dial alone is not proof of life: a peer killed a moment ago may still have its p2pd up
    (or one that accepts for a dead handler), and a hung peer accepts but never answers.
    """
    try:
        stream = await asyncio.wait_for(open_stream(p2p, peer_id, limits, swarm_key=swarm_key, timeout=timeout),
                                        timeout)
        try:
            await stream.request(Info().to_wire(), timeout)
        finally:
            await stream.close()
    except RemoteError:
        return True
    except Exception as e:
        logger.debug("%s did not answer an info request: %s", peer_id, e)
        return False
    return True


async def require_auth(stream: PeerStream, swarm_key: SwarmKey, own_peer_id: str) -> bool:
    """Server side of the handshake: True when the stream's first message proves membership.

    The first frame is read with a small limit (`limits.auth_frame_bytes`) and a short timeout
    (`limits.auth_timeout`): a stranger costs a few KiB at most. It gets an `unauthorized` error
    frame that says how to join (and the caller ends the stream); nothing else is read from it.
    """
    try:
        msg = await stream.recv_raw(stream.limits.auth_timeout, max_bytes=stream.limits.auth_frame_bytes)
    except (ProtocolError, ConnectionError, asyncio.TimeoutError):
        return False
    if msg.get("type") == AUTH and swarm_key.check_stream_proof(msg.get("proof"), own_peer_id, stream.remote_peer_id):
        await stream.send({"type": AUTHORIZED})
        return True
    await refuse(stream, ProtocolError(
        "unauthorized", "this swarm is private: join it with its swarm key (--swarm-key FILE / swarm_key=FILE)"))
    return False


async def refuse(stream: PeerStream, error: ProtocolError) -> None:
    """Answer `error` on a stream that is about to be closed, without reading anything else from it."""
    with suppress(ConnectionError):
        await stream.send_error(error)
        # Linger until the remote side hangs up (bounded): closing at once can drop the error
        # frame in p2pd before it is delivered, and then the remote sees a bare disconnect.
        # read(n) discards what arrives: the stream's buffer never grows past n bytes.
        with suppress(Exception):
            deadline = asyncio.get_running_loop().time() + LINGER_SECONDS
            while await asyncio.wait_for(stream.reader.read(4096), deadline - asyncio.get_running_loop().time()):
                pass


async def serve_stream(stream: PeerStream) -> AsyncIterator[dict[str, Any]]:
    """Yield well-formed messages from a handler's stream until the remote side closes it.

    Malformed frames (bad msgpack, missing "type") are answered with an `error` frame and
    serving goes on: the frame boundary is intact. A frame above the limit or a frame cut
    short cannot be skipped safely, so those are answered (when possible) and end the stream.
    """
    while True:
        try:
            msg = await stream.recv_raw()
        except (FrameTooLarge, FrameTimeout) as e:
            with suppress(ConnectionError):
                await write_frame(stream.writer, encode_message(e.to_message()))
            return
        except ConnectionClosed as e:
            if not e.clean:
                logger.debug(f"stream from {stream.remote_peer_id} ended mid-frame: {e}")
            return
        except ProtocolError as e:
            logger.debug(f"bad frame from {stream.remote_peer_id}: {e}")
            try:
                await stream.send_error(e)
            except ConnectionError:
                return
            continue
        except ConnectionError:  # reset by the remote side
            return
        yield msg


StreamHandler = Callable[[Any, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def stream_handler(serve: Callable[[PeerStream], Awaitable[None]], limits: Limits) -> StreamHandler:
    """Adapt `async def serve(stream: PeerStream)` to hivemind's binary stream handler signature.

    Register it with `await p2p.add_binary_stream_handler(PROTOCOL_NAME, stream_handler(serve, limits))`.
    hivemind runs each incoming stream's handler as a task on the loop of that P2P object.
    The wrapper closes the stream when `serve` returns, logs (does not propagate) an
    unexpected exception, and treats cancellation as the end of the stream: hivemind cancels
    handler tasks when its P2P object shuts down, and a cancelled handler task makes asyncio
    print a spurious traceback from its stream callback.

    Per remote peer (libp2p authenticates its id), at most `limits.max_streams_per_peer` streams
    are served at once (more are answered with a `limit` error and closed), and the frames being
    read from all its streams share a buffer of `limits.peer_buffer_bytes`.
    """
    remotes: dict[str, _Remote] = {}

    async def handler(stream_info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_id = getattr(stream_info, "peer_id", None)
        remote_id = str(peer_id) if peer_id is not None else ""
        remote = remotes.get(remote_id)
        if remote is None:
            remote = remotes[remote_id] = _Remote(ByteBudget(limits.peer_buffer_bytes))
        stream = PeerStream(reader, writer, limits, remote_peer_id=remote_id, budget=remote.budget)
        remote.streams += 1
        try:
            if remote.streams > limits.max_streams_per_peer:
                await refuse(stream, ProtocolError(
                    "limit", f"more than {limits.max_streams_per_peer} streams open from one peer; "
                    "close some (one stream per session) or use another peer"))
                return
            await serve(stream)
        except asyncio.CancelledError:
            logger.debug(f"handler for {stream.remote_peer_id} cancelled (P2P shutting down)")
        except Exception:
            logger.exception(f"stream handler for {stream.remote_peer_id} crashed")
        finally:
            remote.streams -= 1
            if remote.streams == 0:
                remotes.pop(remote_id, None)
            stream._broken = stream._broken or "handler finished"
            writer.close()

    return handler


class _Remote:
    """What one remote peer holds on this side: open streams, and its share of frame buffers."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.streams = 0
