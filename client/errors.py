"""What the client raises, and which failures mean "route around this peer"."""

from __future__ import annotations

import asyncio

from swarm.errors import ConnectionClosed, RemoteError

# Errors that say "this hop is unusable now": we reroute. Other RemoteErrors mean the
# request itself is wrong (a bug or a user error) and are raised as they are.
FAILOVER_CODES = {"busy", "push_failed", "timeout", "shutting_down", "internal", "wrong_layers",
                  "out_of_order", "no_session", "bad_reply"}


class SwarmError(RuntimeError):
    """Generation through the swarm could not continue; the message says why and what to try."""


def is_hop_failure(error: BaseException) -> bool:
    if isinstance(error, RemoteError):
        return error.retryable or error.code in FAILOVER_CODES
    return isinstance(error, (ConnectionError, ConnectionClosed, asyncio.TimeoutError, OSError))
