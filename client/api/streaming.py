"""Server-sent events: `stream: true` answers as `data: {chunk}` lines, then `data: [DONE]`.

The response starts only once the first token is there, so a request the swarm cannot serve
(no route, busy peers, a prompt a peer refuses) still gets its proper status code and JSON
error. An error after that arrives as a `data: {"error": ...}` event before `[DONE]`, as vLLM does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from client.api.engine import Delta, Finished
from client.api.errors import ApiError
from client.api.metrics import METRICS
from client.api.responses import Reply

HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
           "X-Accel-Buffering": "no"}  # tells proxies (nginx) not to buffer the stream


async def send(response: web.StreamResponse, obj: Any) -> None:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    await response.write(f"data: {data}\n\n".encode())


async def stream_reply(request: web.Request, events: AsyncIterator[Delta | Finished], reply: Reply) -> web.StreamResponse:
    first = await anext(events)  # an ApiError here becomes a plain JSON error response
    response = web.StreamResponse(headers=HEADERS)
    await response.prepare(request)
    if reply.chat:
        await send(response, reply.chunk("", first=True))
    try:
        event = first
        while True:
            if isinstance(event, Finished):
                await send(response, reply.chunk(None, event.reason))
                if reply.include_usage:
                    await send(response, reply.usage_chunk(event))
                break
            await send(response, reply.chunk(event.text))
            event = await anext(events)
    except ApiError as e:  # too late for a status code: an error event, as vLLM sends
        request.app[METRICS].failure(e.status)
        await send(response, e.body())
    await send(response, "[DONE]")
    await response.write_eof()
    return response


async def collect(events: AsyncIterator[Delta | Finished]) -> tuple[str, Finished]:
    """The whole text and the final event (non-streaming answers)."""
    parts = []
    async for event in events:
        if isinstance(event, Finished):
            return "".join(parts), event
        parts.append(event.text)
    raise RuntimeError("generation ended without a Finished event")
