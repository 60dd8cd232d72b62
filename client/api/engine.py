"""`Engine`: runs requests through one shared `DistributedModel`, each in its own inference session.

`DistributedModel.generate` is synchronous (it waits on the client's private loop thread), so
each request runs it on a worker thread. Its streamer hands token ids to the request's asyncio
queue; the request coroutine turns them into text deltas. When the HTTP client goes away, the
coroutine sets a flag the streamer checks at the next token: it raises, `generate` closes the
session on every peer, and the worker is free again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from client.api.errors import bad_request, from_generation_error, no_route
from client.api.metrics import ApiMetrics
from client.api.schema import ChatMessage, Sampling
from client.api.text import Detokenizer, StopScanner
from client.model import DistributedModel
from routing import NoRouteError

logger = logging.getLogger(__name__)

ROUTE_CACHE_S = 2.0  # /v1/models, /health and admission share one route check per this long
_END = object()


class Cancelled(Exception):
    """Raised inside `generate` (from the streamer) when the HTTP client went away."""


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" (EOS or a stop string) or "length"
    prompt_tokens: int
    completion_tokens: int


class QueueStreamer:
    """A transformers-style streamer (put/end) that feeds an asyncio queue from the worker thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, cancel: threading.Event) -> None:
        self.loop, self.queue, self.cancel = loop, queue, cancel
        self.prompt_seen = False

    def put(self, ids: torch.Tensor) -> None:
        if self.cancel.is_set():
            raise Cancelled("the HTTP client went away")
        if not self.prompt_seen:  # generate() puts the prompt first
            self.prompt_seen = True
            return
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ids.flatten().tolist())

    def end(self) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, _END)


class Engine:
    def __init__(self, model: DistributedModel, max_running: int, metrics: ApiMetrics) -> None:
        if model.tokenizer is None:
            raise ValueError(f"{model.path} has no tokenizer; the gateway needs one to turn text into tokens")
        self.model = model
        self.tokenizer = model.tokenizer
        self.name = model.model_name
        self.context = model.model_config.max_position_embeddings
        self.metrics = metrics
        self.slots = asyncio.Semaphore(max_running)
        self.pool = ThreadPoolExecutor(max_running, thread_name_prefix="swarm-api-generate")
        self.special = set(self.tokenizer.all_special_ids)
        self._route: tuple[float, str | None] = (-1e9, None)

    # -- the swarm ---------------------------------------------------------------------------------
    async def route_problem(self) -> str | None:
        """None when a route covers every layer now, else why not (cached for ROUTE_CACHE_S)."""
        checked, problem = self._route
        if time.monotonic() - checked < ROUTE_CACHE_S:
            return problem
        swarm = self.model.swarm
        future = asyncio.run_coroutine_threadsafe(swarm.plan(0, swarm.num_layers), self.model.loop.loop)
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), swarm.config.connect_timeout)
            problem = None
        except NoRouteError as e:
            problem = str(e)
        except Exception as e:  # the DHT did not answer: as good as no route
            problem = f"reading the DHT failed: {type(e).__name__}: {e}"
        self._route = (time.monotonic(), problem)
        return problem

    # -- prompts -----------------------------------------------------------------------------------
    def check_model(self, sampling: Sampling) -> None:
        if sampling.model != self.name:
            raise bad_request(f"unknown model {sampling.model!r}; this gateway serves {self.name!r} "
                              "(see GET /v1/models)", "model", "model_not_found")

    def chat_ids(self, messages: tuple[ChatMessage, ...]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise bad_request(f"{self.name} has no chat template; use /v1/completions", "messages")
        try:
            text = self.tokenizer.apply_chat_template([{"role": m.role, "content": m.content} for m in messages],
                                                      add_generation_prompt=True, tokenize=False)
        except Exception as e:  # templates raise on what they do not accept (e.g. roles that do not alternate)
            raise bad_request(f"the chat template of {self.name} refused these messages: {e}", "messages") from None
        return self.tokenizer(text, add_special_tokens=False).input_ids  # the template holds BOS etc.

    def text_ids(self, prompt: str | tuple[int, ...]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer(prompt).input_ids
        vocab = self.model.model_config.vocab_size
        if not all(0 <= t < vocab for t in prompt):
            raise bad_request(f"prompt token ids must be in [0, {vocab})", "prompt", "invalid_value")
        return list(prompt)

    def budget(self, prompt_ids: list[int], sampling: Sampling) -> int:
        """max_tokens, or what is left of the context; 400 naming the limit when it does not fit."""
        room = self.context - len(prompt_ids)
        wanted = sampling.max_tokens if sampling.max_tokens is not None else room
        if room < 1 or wanted > room:
            raise bad_request(
                f"this model's maximum context length is {self.context} tokens, but {len(prompt_ids)} prompt "
                f"tokens + {wanted} max_tokens need {len(prompt_ids) + wanted}; shorten the prompt or lower "
                "max_tokens", "max_tokens" if room >= 1 else "messages", "context_length_exceeded")
        return wanted

    # -- generation --------------------------------------------------------------------------------
    def _generate(self, prompt_ids: list[int], sampling: Sampling, max_new: int, streamer: QueueStreamer) -> None:
        do_sample = None if sampling.temperature is None else sampling.temperature > 0
        generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        try:
            self.model.generate(
                torch.tensor([prompt_ids]), max_new_tokens=max_new, do_sample=do_sample,
                temperature=sampling.temperature or None, top_p=sampling.top_p, top_k=sampling.top_k,
                repetition_penalty=sampling.repetition_penalty, streamer=streamer, generator=generator,
                stop=list(sampling.stop) or None,
            )
        finally:
            streamer.end()  # also when generate() refused its arguments before streaming anything

    async def run(self, prompt_ids: list[int], sampling: Sampling, max_new: int) -> AsyncIterator[Delta | Finished]:
        """Text deltas, then one `Finished`. Raises `ApiError` (before or during the stream)."""
        started = time.perf_counter()
        problem = await self.route_problem()
        if problem is not None:
            raise no_route(problem)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        self.metrics.waiting.inc()
        try:
            await self.slots.acquire()
        finally:
            self.metrics.waiting.dec()
        self.metrics.running.inc()
        future = loop.run_in_executor(self.pool, self._generate, prompt_ids, sampling, max_new,
                                      QueueStreamer(loop, queue, cancel))
        detok, scanner = Detokenizer(self.tokenizer, prompt_ids), StopScanner(sampling.stop)
        generated: list[int] = []
        last, finished = started, False
        try:
            while not scanner.stopped:
                item = await queue.get()
                if item is _END:
                    break
                now = time.perf_counter()
                (self.metrics.tpot if generated else self.metrics.ttft).observe(now - last)
                last = now
                generated.extend(item)
                text = scanner.feed(detok.add(item))
                if text:
                    yield Delta(text)
            if scanner.stopped:
                cancel.set()  # generate() stops at the same token by itself; this covers decoding differences
            try:
                await future
            except Cancelled:
                pass
            except Exception as e:
                raise from_generation_error(e) from e
            tail = scanner.feed(detok.flush()) + scanner.flush()
            if tail:
                yield Delta(tail)
            early = len(generated) < max_new or bool(generated and generated[-1] in self.special)
            reason = "stop" if scanner.stopped or early else "length"
            self.metrics.prompt_tokens.inc(len(prompt_ids))
            self.metrics.generation_tokens.inc(len(generated))
            self.metrics.e2e.observe(time.perf_counter() - started)
            self.metrics.success(reason)
            finished = True
            yield Finished(reason, len(prompt_ids), len(generated))
        except (asyncio.CancelledError, GeneratorExit, ConnectionError):
            if not finished:  # the consumer left before the end (not the aclose after Finished)
                self.metrics.aborted()
            raise
        finally:
            cancel.set()

            def release(_: Any = None) -> None:
                self.slots.release()
                self.metrics.running.dec()

            if future.done():
                release()
            else:  # the worker stops at its next token; its slot frees only then
                future.add_done_callback(release)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
