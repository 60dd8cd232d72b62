"""`ApiError`: an HTTP error in OpenAI's JSON shape, and how swarm failures map onto it.

OpenAI clients read `{"error": {"message", "type", "param", "code"}}` and the status code:
400 the request is wrong (the message says what to change), 401 the key is wrong, 429 try
again later (peers are busy), 503 the swarm cannot serve the model now (with Retry-After).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from client.errors import SwarmError
from routing import NoRouteError
from swarm.errors import RemoteError

RETRY_AFTER_S = 5  # about one DHT view refresh: a route may appear, peers may free pages
BUSY_CODES = {"busy", "rate_limited", "too_many_sessions"}  # the peers' "not now" answers
REQUEST_CODES = {"too_long", "limit"}  # the peers' "this request is too big" answers


@dataclass
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def no_route(detail: str) -> ApiError:
    return ApiError(503, f"the swarm cannot serve this model right now: {detail}", "service_unavailable_error",
                    None, "no_route", RETRY_AFTER_S)


def _chain(error: BaseException) -> list[BaseException]:
    """The error and its causes, innermost last (bounded: chains are short, cycles are possible)."""
    out: list[BaseException] = []
    while error is not None and error not in out and len(out) < 16:
        out.append(error)
        error = error.__cause__ or error.__context__
    return out


def from_generation_error(error: BaseException) -> ApiError:
    """What to answer when a generation through the swarm failed with `error`."""
    chain = _chain(error)
    if isinstance(error, ApiError):
        return error
    for e in chain:
        if isinstance(e, RemoteError) and e.code in BUSY_CODES:
            return ApiError(429, f"the peers are busy ({e.code}: {e.message}); retry in a few seconds",
                            "rate_limit_error", None, "peers_busy", RETRY_AFTER_S)
        if isinstance(e, RemoteError) and e.code in REQUEST_CODES:
            return bad_request(f"a peer refused the request: {e.message}", None, e.code)
        if isinstance(e, NoRouteError):
            return no_route(str(e))
    if isinstance(error, ValueError):  # DistributedModel.generate's own argument checks
        return bad_request(str(error))
    if isinstance(error, SwarmError):  # the route kept failing (peers died, retries exhausted)
        return no_route(str(error))
    return ApiError(500, f"generation failed: {type(error).__name__}: {error}", "server_error", None, "internal")
