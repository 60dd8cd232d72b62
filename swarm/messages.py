"""The message vocabulary of the `layerswarm/v1` stream protocol, plus field validators.

See docs/protocol.md for what each message means. Validators take a decoded message
(untrusted) and return a clean Python value or raise ProtocolError("bad_field", ...)
naming the field, so handlers read as a list of `require_*` calls.
"""

from __future__ import annotations

from typing import Any

import torch

from swarm.codec import Limits, decode_tensor
from swarm.errors import ProtocolError

PROTOCOL_NAME = "layerswarm/v1"  # libp2p stream handler name

# client -> peer requests
INFO = "info"
FORWARD = "forward"
OPEN = "open"
STEP = "step"
TRUNCATE = "truncate"
CLOSE = "close"
VIEW = "view"  # the records a peer sees for a model (peer/view.py); the reply has the same type
# peer -> peer
PUSH = "push"
# client or peer -> peer: "this peer does not answer me" (peer/crash_notices.py); replied to with NOTED
CRASH_NOTICE = "crash_notice"
# replies
RESULT = "result"
OPENED = "opened"
AUTH = "auth"  # first message on a stream into a private swarm's peer (swarm/auth.py)
AUTHORIZED = "authorized"
TRUNCATED = "truncated"
CLOSED = "closed"
NOTED = "noted"
ERROR = "error"

REQUEST_TYPES = frozenset({INFO, FORWARD, OPEN, STEP, TRUNCATE, CLOSE, PUSH, AUTH, VIEW, CRASH_NOTICE})
REPLY_TYPES = frozenset({INFO, RESULT, OPENED, TRUNCATED, CLOSED, ERROR, AUTHORIZED, VIEW, NOTED})

# Error codes carried by `error` frames. Retryable means "the same request may succeed
# later or elsewhere" (a client should fail over); the others mean "the request is wrong".
ERROR_CODES: dict[str, bool] = {
    "bad_frame": False,  # framing broken (truncated frame)
    "too_large": False,  # frame or tensor above the receiver's limits
    "bad_message": False,  # not a msgpack map with a str "type"
    "bad_tensor": False,  # tensor dict malformed (dtype, shape, byte count)
    "bad_field": False,  # a field is missing or has the wrong type/range
    "unknown_type": False,  # message type not understood by this peer
    "no_session": False,  # step/truncate/close before open, or unknown session id for push
    "session_exists": False,  # open with a session id already in use on this stream/peer
    "out_of_order": False,  # step positions != session's current length, or step_id not increasing
    "wrong_layers": True,  # requested layers are not (or no longer) served by this peer
    "busy": True,  # out of KV pages or queue full
    "push_failed": True,  # could not deliver a push to the downstream peer (message names it)
    "timeout": True,  # a downstream push or the compute did not finish in time
    "shutting_down": True,  # peer is leaving
    "internal": True,  # unexpected exception in the peer (it keeps running)
    "unauthorized": False,  # a private swarm's peer, and the stream did not start with a valid `auth`
    "too_long": False,  # the step would pass the session's max_length
    "limit": False,  # a request above one of the peer's limits (batch size, ...)
    "rate_limited": True,  # more steps per second from this client than the peer allows
    "too_many_sessions": True,  # this client already holds the most sessions one client may hold here
}


def error_message(code: str, message: str, retryable: bool | None = None) -> dict[str, Any]:
    """Build an `error` frame; retryable defaults to the code's entry in ERROR_CODES."""
    if retryable is None:
        retryable = ERROR_CODES.get(code, False)
    return {"type": ERROR, "code": code, "message": message, "retryable": retryable}


def _bad(key: str, why: str) -> ProtocolError:
    return ProtocolError("bad_field", f"field {key!r}: {why}")


def require_type(msg: dict[str, Any], allowed: frozenset[str] = REQUEST_TYPES) -> str:
    kind = msg.get("type")
    if kind not in allowed:
        raise ProtocolError("unknown_type", f"message type {kind!r:.40} is not one of {sorted(allowed)}")
    return kind


def require_int(
    msg: dict[str, Any],
    key: str,
    *,
    min: int | None = None,
    max: int | None = None,
    default: int | None = None,
) -> int:
    """An int field in [min, max]; a missing field returns `default` when one is given."""
    if key not in msg and default is not None:
        return default
    value = msg.get(key)
    if type(value) is not int:  # excludes bool and float on purpose
        raise _bad(key, f"expected an int, got {type(value).__name__}")
    if min is not None and value < min:
        raise _bad(key, f"{value} is below the minimum {min}")
    if max is not None and value > max:
        raise _bad(key, f"{value} is above the maximum {max}")
    return value


def require_bool(msg: dict[str, Any], key: str, *, default: bool | None = None) -> bool:
    if key not in msg and default is not None:
        return default
    value = msg.get(key)
    if not isinstance(value, bool):
        raise _bad(key, f"expected a bool, got {type(value).__name__}")
    return value


def require_str(msg: dict[str, Any], key: str, *, max_len: int = 256, default: str | None = None) -> str:
    if key not in msg and default is not None:
        return default
    value = msg.get(key)
    if not isinstance(value, str):
        raise _bad(key, f"expected a str, got {type(value).__name__}")
    if len(value) > max_len:
        raise _bad(key, f"string of {len(value)} chars exceeds {max_len}")
    return value


def require_int_list(
    msg: dict[str, Any],
    key: str,
    *,
    length: int | None = None,
    min: int | None = None,
    max: int | None = None,
) -> list[int]:
    """A list of ints, optionally of an exact length, each in [min, max]."""
    value = msg.get(key)
    if not isinstance(value, list):
        raise _bad(key, f"expected a list of ints, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise _bad(key, f"expected {length} entries, got {len(value)}")
    for i, item in enumerate(value):
        if type(item) is not int:
            raise _bad(key, f"entry {i} is {type(item).__name__}, not int")
        if (min is not None and item < min) or (max is not None and item > max):
            raise _bad(key, f"entry {i} = {item} is outside [{min}, {max}]")
    return value


def require_layers(
    msg: dict[str, Any], key: str = "layers", *, num_layers: int | None = None
) -> tuple[int, int]:
    """A half-open layer range [a, b) sent as a two-int list, with 0 <= a < b (<= num_layers)."""
    a, b = require_int_list(msg, key, length=2, min=0, max=num_layers)
    if a >= b:
        raise _bad(key, f"empty or reversed range [{a}, {b})")
    return a, b


def require_tensor(
    msg: dict[str, Any],
    key: str,
    limits: Limits,
    *,
    ndim: int | None = None,
    dtypes: tuple[torch.dtype, ...] = (),
) -> torch.Tensor:
    """Decode a tensor field; optionally require its number of dims and dtype."""
    if key not in msg:
        raise _bad(key, "missing tensor")
    try:
        tensor = decode_tensor(msg[key], limits)
    except ProtocolError as e:
        raise ProtocolError(e.code, f"field {key!r}: {e.message}") from None
    if ndim is not None and tensor.dim() != ndim:
        raise _bad(key, f"expected {ndim} dims, got shape {tuple(tensor.shape)}")
    if dtypes and tensor.dtype not in dtypes:
        raise _bad(key, f"dtype {tensor.dtype} not accepted here; expected one of {dtypes}")
    return tensor


def require_map(msg: dict[str, Any], key: str, *, optional: bool = False) -> dict[str, Any] | None:
    if key not in msg and optional:
        return None
    value = msg.get(key)
    if not isinstance(value, dict):
        raise _bad(key, f"expected a map, got {type(value).__name__}")
    return value
