"""aiohttp routes of the monitor: `/` (page), `/api/v1/state` (JSON), `/metrics` (Prometheus).

Handlers only read the collector's cached state, so they answer in microseconds whatever the
swarm is doing. Bad requests get a clear message: unknown path -> 404, a query string that does
not parse or names an unknown parameter -> 400 (HTML for the page, JSON under /api/).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web
from prometheus_client import CollectorRegistry

from client.monitor.collector import Collector
from client.monitor.metrics import CONTENT_TYPE, make_registry, render_metrics
from client.monitor.page import render_error, render_page
from client.monitor.state import select_model, with_age

COLLECTOR = web.AppKey("collector", Collector)
STALE_AFTER = web.AppKey("stale_after", float)
REGISTRY = web.AppKey("registry", CollectorRegistry)
MAX_QUERY = 2048  # longer query strings are not something this page ever makes


class BadQuery(ValueError):
    """The query string cannot be honoured: answered 400 with this message."""


class UnknownModel(LookupError):
    """`?model=NAME` names no model in the swarm: answered 404."""


def parse_query(raw: str, allowed: frozenset[str]) -> dict[str, str]:
    """Strictly parse a query string: UTF-8 percent-encoding, `k=v` pairs, known keys, no repeats."""
    if not raw:
        return {}
    if len(raw) > MAX_QUERY:
        raise BadQuery(f"query string longer than {MAX_QUERY} characters")
    try:
        pairs = parse_qsl(raw, keep_blank_values=True, strict_parsing=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise BadQuery("query string is not valid UTF-8 after percent-decoding") from None
    except ValueError as e:
        raise BadQuery(f"query string does not parse ({e}); expected name=value pairs") from None
    out: dict[str, str] = {}
    for key, value in pairs:
        if key not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise BadQuery(f"unknown parameter {key!r} (known: {known})")
        if key in out:
            raise BadQuery(f"parameter {key!r} given twice")
        if not value:
            raise BadQuery(f"parameter {key!r} needs a value, e.g. {key}=NAME")
        out[key] = value
    return out


def wants_json(request: web.Request) -> bool:
    return request.path.startswith("/api/")


def error_response(request: web.Request, status: int, title: str, message: str) -> web.Response:
    if wants_json(request):
        body = json.dumps({"error": {"status": status, "title": title, "message": message}})
        return web.Response(status=status, text=body, content_type="application/json")
    return web.Response(status=status, text=render_error(status, title, message), content_type="text/html")


@web.middleware
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn aiohttp's plain-text 404/405 and our BadQuery into readable pages; add safe headers."""
    try:
        response = await handler(request)
    except BadQuery as e:
        response = error_response(request, 400, "Bad request", str(e))
    except UnknownModel as e:
        response = error_response(request, 404, "Unknown model", f"No model named {e.args[0]!r} is announced in the swarm.")
    except web.HTTPNotFound:
        response = error_response(request, 404, "Not found", f"There is nothing at {request.path}.")
    except web.HTTPMethodNotAllowed as e:
        response = error_response(request, 405, "Method not allowed", f"{request.method} is not allowed here.")
        response.headers["Allow"] = ", ".join(sorted(e.allowed_methods))
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


def current_state(request: web.Request) -> dict[str, Any]:
    return with_age(request.app[COLLECTOR].state, time.time(), request.app[STALE_AFTER])


def filtered(request: web.Request) -> tuple[dict[str, Any], str | None]:
    query = parse_query(request.rel_url.raw_query_string, frozenset({"model"}))
    model = query.get("model")
    state = select_model(current_state(request), model)
    if state is None:
        raise UnknownModel(model)
    return state, model


async def page(request: web.Request) -> web.Response:
    state, model = filtered(request)
    nonce = secrets.token_urlsafe(16)
    response = web.Response(text=render_page(state, nonce, model), content_type="text/html")
    # The only script allowed is ours (by nonce): even an escaping bug could not run a peer's script.
    response.headers["Content-Security-Policy"] = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"
    )
    return response


async def api_state(request: web.Request) -> web.Response:
    state, _ = filtered(request)
    return web.json_response(state, dumps=lambda obj: json.dumps(obj, allow_nan=False))


async def metrics(request: web.Request) -> web.Response:
    parse_query(request.rel_url.raw_query_string, frozenset())
    body = render_metrics(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def make_app(collector: Collector, stale_after: float) -> web.Application:
    """The web application over a collector (whose refresh loop the caller runs)."""
    app = web.Application(middlewares=[errors_middleware])
    app[COLLECTOR] = collector
    app[STALE_AFTER] = stale_after
    app[REGISTRY] = make_registry(lambda: with_age(collector.state, time.time(), stale_after))
    app.router.add_get("/", page)
    app.router.add_get("/api/v1/state", api_state)
    app.router.add_get("/metrics", metrics)
    return app
