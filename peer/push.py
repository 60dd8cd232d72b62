"""Server-to-server push: a peer sends a session's output straight to the next hop of its route.

One outgoing libp2p stream per upstream session, opened at its first push and closed with it.
The downstream peer answers pushes on the client's own stream, so nothing is expected back here;
a small reader task drains the link and logs the refusals it may carry.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from hivemind.p2p import P2P, PeerID

from swarm.codec import Limits, decode_message, encode_message
from swarm.errors import ConnectionClosed, ProtocolError
from swarm.framing import read_frame, write_frame
from swarm.messages import PROTOCOL_NAME

logger = logging.getLogger(__name__)


@dataclass
class _Link:
    writer: asyncio.StreamWriter
    drain_task: asyncio.Task


class PushLinks:
    def __init__(self, p2p: P2P, limits: Limits, timeout: float) -> None:
        self._p2p = p2p
        self._limits = limits
        self._timeout = timeout
        self._links: dict[str, _Link] = {}  # upstream session id -> link to its next hop
        self.pushes = 0

    async def send(self, session_id: str, peer_id: str, msg: dict[str, Any]) -> None:
        link = self._links.get(session_id)
        if link is None or link.drain_task.done():
            link = await asyncio.wait_for(self._connect(peer_id), self._timeout)
            self._links[session_id] = link
        await asyncio.wait_for(write_frame(link.writer, encode_message(msg)), self._timeout)
        self.pushes += 1

    async def _connect(self, peer_id: str) -> _Link:
        _, reader, writer = await self._p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), PROTOCOL_NAME)
        return _Link(writer, asyncio.get_running_loop().create_task(self._drain(peer_id, reader)))

    async def _drain(self, peer_id: str, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                reply = decode_message(await read_frame(reader, self._limits.max_frame_bytes), self._limits)
                if reply.get("type") == "error":
                    logger.warning("push to %s refused: %s", peer_id, reply.get("message"))
        except (ConnectionClosed, ConnectionError, ProtocolError):
            pass

    def close(self, session_id: str) -> None:
        link = self._links.pop(session_id, None)
        if link is not None:
            link.drain_task.cancel()
            link.writer.close()

    def close_all(self) -> None:
        for session_id in list(self._links):
            self.close(session_id)
