"""Exceptions shared by framing, codec and connections.

They live apart from the code that raises them so `framing.py` (bytes only) and
`codec.py` (msgpack + torch) can both raise them without importing each other.
"""

from __future__ import annotations

from typing import Any


class ProtocolError(Exception):
    """The other side sent something we refuse to process.

    `code` is a short snake_case string (see `messages.ERROR_CODES`) that travels on the
    wire in an `error` frame; `message` is a human-readable explanation.
    """

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable

    def to_message(self) -> dict[str, Any]:
        """The `error` frame that answers the offending request."""
        return {"type": "error", "code": self.code, "message": self.message, "retryable": self.retryable}


class FrameTooLarge(ProtocolError):
    """A frame declared a length above the receiver's limit; raised before reading the payload.

    The payload is still unread in the stream, so the stream cannot be resynchronised:
    answer with `to_message()` and close it.
    """

    def __init__(self, declared: int, limit: int) -> None:
        super().__init__("too_large", f"frame of {declared} bytes exceeds the limit of {limit} bytes")
        self.declared = declared
        self.limit = limit


class FrameTimeout(ProtocolError):
    """A frame's payload did not arrive in time after its header: the stream stopped mid-frame.

    Like FrameTooLarge, the stream cannot be resynchronised: answer and close it.
    """

    def __init__(self, declared: int, seconds: float | None) -> None:
        super().__init__("timeout", f"a frame of {declared} bytes did not arrive within {seconds:.0f} s")
        self.declared = declared


class PeerUnreachable(ConnectionError):
    """No stream could be opened to a peer at all (every dial failed, or it runs no handler):
    it is gone or unreachable, unlike a stream that breaks mid-request."""


class ConnectionClosed(ConnectionError):
    """The stream ended. `clean` is True at a frame boundary, False when a frame was cut short."""

    def __init__(self, message: str, clean: bool) -> None:
        super().__init__(message)
        self.clean = clean


class RemoteError(Exception):
    """The remote side answered with an `error` frame."""

    def __init__(self, code: str, message: str, retryable: bool = False, peer_id: str = "") -> None:
        where = f" from {peer_id}" if peer_id else ""
        super().__init__(f"remote error{where}: {code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.peer_id = peer_id
