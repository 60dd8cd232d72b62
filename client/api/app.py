"""aiohttp routes of the gateway: the OpenAI endpoints, `/v1/models`, `/health`, `/metrics`, `/`.

Every error under `/v1/` is OpenAI-shaped JSON (see errors.py), including aiohttp's own 404,
405 and 413 and bodies that are not JSON. With an API key file, `/v1/` needs
`Authorization: Bearer KEY`; the page, `/health` and `/metrics` stay open (they hold no answers).
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

from aiohttp import web

from client.api.engine import Engine
from client.api.errors import ApiError, bad_request
from client.api.metrics import CONTENT_TYPE, METRICS, ApiMetrics
from client.api.page import render_page
from client.api.responses import Reply
from client.api.schema import Sampling, parse_chat, parse_completion
from client.api.streaming import collect, stream_reply

logger = logging.getLogger(__name__)

ENGINE = web.AppKey("engine", Engine)
API_KEYS = web.AppKey("api_keys", tuple)
MAX_BODY = 4 << 20  # bytes; long chats fit, a runaway upload does not


def authorized(request: web.Request) -> bool:
    keys: tuple[str, ...] = request.app[API_KEYS]
    if not keys:
        return True
    given = request.headers.get("Authorization", "")
    token = given[7:].strip() if given[:7].lower() == "bearer " else ""
    # Compare with every key, always: the time taken does not tell which key nearly matched.
    return sum(hmac.compare_digest(token.encode(), key.encode()) for key in keys) > 0


def json_error(error: ApiError) -> web.Response:
    return web.json_response(error.body(), status=error.status, headers=error.headers())


@web.middleware
async def api_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    api = request.path.startswith("/v1/")
    try:
        if api and not authorized(request):
            raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer YOUR_KEY'",
                           "authentication_error", None, "invalid_api_key")
        response = await handler(request)
    except ApiError as e:
        if api:
            request.app[METRICS].failure(e.status)
        response = json_error(e)
    except web.HTTPException as e:  # aiohttp's 404/405/413: OpenAI-shaped under /v1/, plain elsewhere
        if not api or e.status < 400:
            raise
        message = {404: f"there is nothing at {request.path}", 405: f"{request.method} is not allowed here",
                   413: f"the request body is larger than {MAX_BODY} bytes"}.get(e.status, e.reason)
        response = json_error(ApiError(e.status, message, "invalid_request_error", None, None))
        if e.status == 405:
            response.headers["Allow"] = e.headers.get("Allow", "")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    return response


async def read_json(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON ({e})") from None


async def answer(request: web.Request, prompt_ids: list[int], sampling: Sampling, chat: bool) -> web.StreamResponse:
    engine = request.app[ENGINE]
    max_new = engine.budget(prompt_ids, sampling)
    reply = Reply(engine.name, chat, sampling.include_usage)
    async with aclosing(engine.run(prompt_ids, sampling, max_new)) as events:
        if sampling.stream:
            return await stream_reply(request, events, reply)
        text, done = await collect(events)
        return web.json_response(reply.whole(text, done))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    req = parse_chat(await read_json(request))
    request.app[ENGINE].check_model(req.sampling)
    return await answer(request, request.app[ENGINE].chat_ids(req.messages), req.sampling, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    req = parse_completion(await read_json(request))
    request.app[ENGINE].check_model(req.sampling)
    return await answer(request, request.app[ENGINE].text_ids(req.prompt), req.sampling, chat=False)


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    serving = await engine.route_problem() is None
    data = [{"id": engine.name, "object": "model", "created": int(time.time()), "owned_by": "layerswarm",
             "max_model_len": engine.context}] if serving else []
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    problem = await engine.route_problem()
    body = {"status": "ok" if problem is None else "unavailable", "model": engine.name, "problem": problem}
    return web.json_response(body, status=200 if problem is None else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].render(), headers={"Content-Type": CONTENT_TYPE})


async def page(request: web.Request) -> web.Response:
    nonce = secrets.token_urlsafe(16)
    response = web.Response(text=render_page(nonce), content_type="text/html")
    # Only our own inline script runs (by nonce); the page talks to this origin and nothing else.
    response.headers["Content-Security-Policy"] = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'"
    )
    return response


def make_app(engine: Engine, metrics_: ApiMetrics, api_keys: tuple[str, ...] = ()) -> web.Application:
    app = web.Application(middlewares=[api_middleware], client_max_size=MAX_BODY)
    app[ENGINE] = engine
    app[METRICS] = metrics_
    app[API_KEYS] = api_keys
    app.router.add_get("/", page)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    return app
