"""Server-to-server push: a peer sends a session's output straight to the next hop of its route.

One outgoing libp2p stream per upstream session, opened at its first push and closed with it.
The downstream peer answers pushes on the client's own stream, so nothing is expected back here;
a small reader task drains the link and logs the refusals (`error` replies) it may carry.
Both directions go through the typed schema (swarm/schema.py): `Push` out, `Error` back.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from swarm.auth import SwarmKey
from swarm.codec import Limits
from swarm.connection import PeerStream, open_stream
from swarm.errors import ConnectionClosed, ProtocolError
from swarm.schema import Error, Push

logger = logging.getLogger(__name__)


@dataclass
class _Link:
    stream: PeerStream
    drain_task: asyncio.Task


class PushLinks:
    def __init__(self, p2p: Any, limits: Limits, timeout: float, swarm_key: SwarmKey | None = None) -> None:
        self._p2p = p2p
        self._swarm_key = swarm_key
        self._limits = limits
        self._timeout = timeout
        self._links: dict[str, _Link] = {}  # upstream session id -> link to its next hop
        self.pushes = 0

    async def send(self, session_id: str, peer_id: str, push: Push, hidden: dict[str, Any] | None = None) -> None:
        """Push one step of upstream session `session_id` to `peer_id` (a link is opened on first use).

        `hidden`: `push.hidden` already encoded (the same output went to the client as `result`).
        """
        link = self._links.get(session_id)
        if link is None or link.drain_task.done() or link.stream.remote_peer_id != peer_id:
            if link is not None:
                self.close(session_id)  # the route changed (failover): drop the old link
            stream = await asyncio.wait_for(open_stream(self._p2p, peer_id, self._limits, swarm_key=self._swarm_key), self._timeout)
            link = _Link(stream, asyncio.get_running_loop().create_task(self._drain(stream)))
            self._links[session_id] = link
        msg = push.to_wire({"hidden": hidden} if hidden is not None else None)
        await asyncio.wait_for(link.stream.send(msg), self._timeout)
        self.pushes += 1

    async def _drain(self, stream: PeerStream) -> None:
        try:
            while True:
                reply = await stream.recv_raw()
                if reply["type"] == Error.TYPE:  # nothing else is expected on a push link
                    error = Error.from_wire(reply, self._limits)
                    logger.warning("push to %s refused (%s): %s", stream.remote_peer_id, error.code, error.message)
        except (ConnectionClosed, ConnectionError, ProtocolError):
            pass

    def close(self, session_id: str) -> None:
        link = self._links.pop(session_id, None)
        if link is not None:
            link.drain_task.cancel()
            link.stream.writer.close()

    def close_all(self) -> None:
        for session_id in list(self._links):
            self.close(session_id)
