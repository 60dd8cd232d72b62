"""The `layerswarm/v1` stream handler: one libp2p stream per client session (see docs/protocol.md).

Every request is validated before anything is allocated; every refusal is an `error` frame and
the stream (and every other session) keeps working. Only an oversized or cut frame ends the
stream, because its remaining bytes cannot be resynchronised.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from peer.config import FaultyOutputs
from peer.page_outputs import PageOutputs
from peer.push import PushLinks
from peer.rate_limit import RateLimiter
from peer.scheduler import BatchScheduler, WorkItem
from peer.sessions import PeerSession, SessionRegistry
from swarm import messages as m
from swarm.auth import SwarmKey
from swarm.codec import Limits, all_finite, encode_tensor
from swarm.connection import PeerStream, require_auth, serve_stream
from swarm.errors import ConnectionClosed, ProtocolError
from swarm.schema import (  # noqa: F401 - MAX_ROUTE_HOPS, parse_chain, parse_token_ids: imported from here by tests
    MAX_ROUTE_HOPS,
    Close,
    CrashNotice,
    Forward,
    Open,
    Push,
    Step,
    Truncate,
    View,
    parse_chain,
    parse_token_ids,
)
from swarm.types import LayerRange

logger = logging.getLogger(__name__)

# Requests that cost a forward pass, and so count against the sender's steps per second. A push
# costs one too: it is charged to the client that opened the session (see `_pushed_step`), not to
# the peer relaying it.
COMPUTE_REQUESTS = frozenset({m.FORWARD, m.STEP})


@dataclass
class ServedModel:
    """What the handler needs to know about the layers this peer serves."""

    layers: LayerRange
    hidden_size: int
    dtype: torch.dtype


class StreamHandler:
    forward_priority = 1  # scheduling priority of stateless forwards (steps: 0); --forward-priority
    page_outputs: PageOutputs | None = None  # set by the server; None disables prefix sharing
    view: Callable[[View], Any] | None = None  # `ViewService.answer` (peer/view.py); None: no `view`
    # `CrashNotices.receive(notice, sender)` (peer/crash_notices.py); None: notices are noted and ignored
    crash_notice: Callable[[CrashNotice, str], bool] | None = None

    def __init__(
        self,
        served: ServedModel,
        registry: SessionRegistry,
        scheduler: BatchScheduler,
        push_links: PushLinks,
        limits: Limits,
        info: Callable[[], dict[str, Any]],
        alloc_timeout: float,
        accepting: Callable[[], bool],
        faulty: FaultyOutputs | None = None,
        swarm_key: SwarmKey | None = None,
        own_peer_id: str = "",
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self.served = served
        self.registry = registry
        self.scheduler = scheduler
        self.push_links = push_links
        self.limits = limits
        self.info = info
        self.alloc_timeout = alloc_timeout
        self.accepting = accepting
        self.faulty = faulty
        self.swarm_key = swarm_key  # private swarm: every stream must start with `auth`
        self.own_peer_id = own_peer_id
        self.rate_limiter = rate_limiter or RateLimiter(0)  # steps per second per client (0: unlimited)
        self.streams: dict[str, PeerStream] = {}  # session id -> the client stream its results go to
        self.errors: Counter[str] = Counter()  # error frames sent, by code (exported as metrics)

    async def serve(self, stream: PeerStream) -> None:
        """Answer one stream's requests until it closes (register with `swarm.connection.stream_handler`)."""
        remote = stream.remote_peer_id
        owned: list[str] = []  # sessions opened on this stream die with it
        if self.swarm_key is not None and not await require_auth(stream, self.swarm_key, self.own_peer_id):
            self.errors["unauthorized"] += 1
            return
        try:
            async for msg in serve_stream(stream):  # bad frames are answered in there
                try:
                    reply = await self._dispatch(msg, remote, stream, owned)
                except ProtocolError as e:
                    await self._send_error(stream, e)
                    continue
                except (ConnectionClosed, ConnectionError):
                    raise
                except Exception as e:  # a bug or a failed forward pass: answer, keep serving
                    logger.exception("request from %s failed", remote)
                    await self._send_error(stream, ProtocolError("internal", str(e), retryable=True))
                    continue
                if reply is not None:
                    await stream.send(reply)
        except (ConnectionClosed, ConnectionError):
            pass
        finally:
            for session_id in owned:
                await self._close_session(session_id)

    async def _close_session(self, session_id: str) -> None:
        self.streams.pop(session_id, None)
        self.push_links.close(session_id)
        await self.registry.close(session_id)

    async def fail_all(self, code: str, message: str) -> None:
        """Tell every open session why it ends (peer shutdown), then free its pages."""
        for session_id, stream in list(self.streams.items()):
            await self._send_error(stream, ProtocolError(code, message, retryable=True))
            await self._close_session(session_id)

    async def _send_error(self, stream: PeerStream, error: ProtocolError) -> None:
        self.errors[error.code] += 1
        try:
            await stream.send(error.to_message())
        except (ConnectionError, ConnectionClosed):
            pass

    async def _dispatch(
        self, msg: dict[str, Any], remote: str, stream: PeerStream, owned: list[str]
    ) -> dict[str, Any] | None:
        kind = m.require_type(msg)
        if kind in COMPUTE_REQUESTS and not self.rate_limiter.allow(remote):
            raise ProtocolError("rate_limited", f"more than {self.rate_limiter.rate:g} steps/s from one client; "
                                "slow down or use another peer", retryable=True)
        if kind == m.INFO:
            return {"type": m.INFO, **self.info()}
        if kind == m.VIEW and self.view is not None:
            return await self.view(View.from_wire(msg, self.limits))
        if kind == m.CRASH_NOTICE:
            notice = CrashNotice.from_wire(msg, self.limits)
            if self.crash_notice is not None:
                self.crash_notice(notice, remote)
            return {"type": m.NOTED}
        if kind == m.FORWARD:
            return await self._forward(Forward.from_wire(msg, self.limits), remote)
        if kind == m.OPEN:
            return self._open(Open.from_wire(msg, self.limits), remote, stream, owned)
        if kind == m.STEP:
            step = Step.from_wire(msg, self.limits)
            session = self.registry.get(self._own_session(step.session_id, owned))
            if step.push_from is not None:  # the client re-binds pushes after replacing the hop before this one
                session.push_from, session.push_token = step.push_from, step.push_token
            await self._step(session, step, stream)
            return None
        if kind == m.PUSH:
            push = Push.from_wire(msg, self.limits)
            session = self.registry.get(push.session_id)
            check_push(session, push, remote)
            # A push's result goes to the stream that opened the session, not back to the pusher.
            asyncio.get_running_loop().create_task(self._pushed_step(session, push))
            return None
        if kind == m.TRUNCATE:
            truncate = Truncate.from_wire(msg, self.limits)
            session = self.registry.get(self._own_session(truncate.session_id, owned))
            await self.registry.truncate(session, truncate.length)
            return {"type": m.TRUNCATED, "length": truncate.length}
        if kind == m.CLOSE:
            session_id = self._own_session(Close.from_wire(msg, self.limits).session_id, owned)
            owned.remove(session_id)
            await self._close_session(session_id)
            return {"type": m.CLOSED, "session_id": session_id}
        raise ProtocolError("unknown_type", f"{kind!r} is not a request a peer answers")

    def _own_session(self, session_id: str | None, owned: list[str]) -> str:
        """The session a request names (default: the stream's first), which must have been opened on this stream."""
        if session_id is None:
            session_id = owned[0] if owned else ""
        if session_id not in owned:
            raise ProtocolError("no_session", f"session {session_id!r} was not opened on this stream; send open first")
        return session_id

    def _layers_of(self, layers: tuple[int, int] | None) -> LayerRange:
        """The request's layer sub-range (default: all served layers), which this peer must cover."""
        if layers is None:
            return self.served.layers
        wanted = LayerRange(*layers)
        if not self.served.layers.covers(wanted):
            raise ProtocolError(
                "wrong_layers", f"this peer serves layers {self.served.layers}, not {wanted}", retryable=True
            )
        return wanted

    def _check_hidden(self, hidden: torch.Tensor, new_tokens: list[int]) -> torch.Tensor:
        """The request's hidden states, checked against what we serve: (sum(new_tokens), H), our dtype, finite."""
        if hidden.dtype != self.served.dtype:
            raise ProtocolError("bad_tensor", f"hidden states must be {self.served.dtype}, got {hidden.dtype}")
        if hidden.shape[1] != self.served.hidden_size:
            raise ProtocolError(
                "bad_tensor", f"hidden size must be {self.served.hidden_size}, got {hidden.shape[1]}"
            )
        if hidden.shape[0] != sum(new_tokens):
            raise ProtocolError(
                "bad_field", f"hidden has {hidden.shape[0]} rows but new_tokens sums to {sum(new_tokens)}"
            )
        if not all_finite(hidden):
            raise ProtocolError("bad_tensor", "hidden states contain NaN or infinity")
        return hidden

    async def _forward(self, request: Forward, remote: str) -> dict[str, Any]:
        """A stateless forward, run as a scratch session that is closed when it is done.

        Its KV pages come from the pool and count against the client's page quota, and the
        scheduler runs it as a chunked prefill behind decode steps: a 4,096-token forward takes
        its turn chunk by chunk instead of freezing every session's decode for its whole length.
        """
        if not self.accepting():
            raise ProtocolError("shutting_down", "this peer is leaving or moving; route elsewhere", retryable=True)
        layers = self._layers_of(request.layers)
        new_tokens = request.new_tokens
        if max(new_tokens) > self.registry.limits.max_length:
            raise ProtocolError("bad_field", f"new_tokens must be at most {self.registry.limits.max_length} per sequence")
        if not 1 <= len(new_tokens) <= self.registry.limits.max_batch:
            raise ProtocolError("bad_field", f"new_tokens must list 1..{self.registry.limits.max_batch} sequences")
        hidden = self._check_hidden(request.hidden, new_tokens)
        scratch = self.registry.open(uuid.uuid4().hex, remote, layers, max(new_tokens), len(new_tokens))
        try:
            await self.registry.reserve(scratch, new_tokens, self.alloc_timeout)
            item = WorkItem(hidden, new_tokens, [0] * len(new_tokens), [t.pages for t in scratch.tables],
                            (layers.start, layers.end), asyncio.get_running_loop().create_future(),
                            priority=self.forward_priority)
            scratch.inflight = item.future
            output = await self.scheduler.submit(item)
        finally:
            await self.registry.close(scratch.session_id)
        return {"type": m.RESULT, "hidden": encode_tensor(self._maybe_corrupt(output))}

    def _open(self, request: Open, remote: str, stream: PeerStream, owned: list[str]) -> dict[str, Any]:
        if not self.accepting():
            raise ProtocolError("shutting_down", "this peer is leaving or moving; route elsewhere", retryable=True)
        session_id = request.session_id or uuid.uuid4().hex
        layers = self._layers_of(request.layers)
        session = self.registry.open(session_id, remote, layers, request.max_length, request.batch)
        session.push_from, session.push_token = request.push_from, request.push_token or ""
        owned.append(session_id)
        self.streams[session_id] = stream
        return {"type": m.OPENED, "session_id": session_id, "page_size": self.registry.pool.page_size}

    async def _step(self, session: PeerSession, step: Step | Push, stream: PeerStream) -> None:
        """Run one step; answer on `stream`, then push the output down the `next` chain if any.

        The answer goes out before the push so the client holds every hop's output (it replays
        them into a replacement when a later hop dies) at no cost to the push's latency.
        """
        step_id, new_tokens, positions, chain = step.step_id, step.new_tokens, step.positions, list(step.next or ())
        if len(new_tokens) != len(session.tables):
            raise ProtocolError("bad_field", f"new_tokens and positions must list the session's {len(session.tables)} "
                                "sequences")
        if positions != session.lengths:
            raise ProtocolError(
                "out_of_order", f"positions {positions} do not follow the cached lengths {session.lengths}"
            )
        if max(p + n for p, n in zip(positions, new_tokens)) > session.max_length:
            raise ProtocolError("too_long", f"step would exceed the session's max_length {session.max_length}")
        hidden = self._check_hidden(step.hidden, new_tokens)
        token_ids = step.token_ids
        if session.busy:
            raise ProtocolError("out_of_order", "a step of this session is still running")
        session.busy = True
        try:
            output = await self._compute(session, hidden, new_tokens, token_ids)
        finally:
            session.busy = False
        encoded = encode_tensor(output)
        await stream.send({"type": m.RESULT, "step_id": step_id, "hidden": encoded})
        if chain:
            (peer_id, next_session, token), rest = chain[0], chain[1:]
            pushed = Push(session_id=next_session, push_token=token, step_id=step_id, hidden=output,
                          new_tokens=new_tokens, positions=positions,
                          token_ids=token_ids, next=tuple(rest) or None)  # token_ids: the next hop shares prefixes too
            try:
                await self.push_links.send(session.session_id, peer_id, pushed, hidden=encoded)
            except Exception as e:  # the client replaces the downstream hop
                raise ProtocolError(
                    "push_failed", f"step {step_id}: could not push to {peer_id}: {e}", retryable=True
                ) from e

    async def _pushed_step(self, session: PeerSession, push: Push) -> None:
        """Run a step that arrived from the previous hop; answer on the session's client stream."""
        stream = self.streams.get(session.session_id)
        if stream is None:
            return
        try:
            if not self.rate_limiter.allow(session.remote):  # the client pays for its pushed steps
                raise ProtocolError("rate_limited", f"more than {self.rate_limiter.rate:g} steps/s from one client "
                                    "(pushed steps count too); slow down or use another peer", retryable=True)
            await self._step(session, push, stream)
        except ProtocolError as e:
            await self._send_error(stream, e)
            return
        except Exception as e:
            logger.exception("pushed step failed")
            await self._send_error(stream, ProtocolError("internal", str(e), retryable=True))
            return

    async def _compute(
        self, session: PeerSession, hidden: torch.Tensor, new_tokens: list[int],
        token_ids: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """Reserve pages (attaching cached prefix pages), compute the uncached rows, assemble all rows.

        Rows of attached shared pages come from `page_outputs` (their output hidden states were
        stored when they were computed); only the remaining suffix of each sequence is run.
        """
        if self.page_outputs is None:
            token_ids = None  # without stored outputs, a shared page's rows could not be returned
        res = await self.registry.reserve(session, new_tokens, self.alloc_timeout, token_ids)
        counts = [n - c for n, c in zip(new_tokens, res.cached_tokens)]  # rows to compute per sequence
        given = torch.split(hidden, new_tokens)
        try:
            if sum(counts) > 0:
                item = WorkItem(
                    torch.cat([rows[c:] for rows, c in zip(given, res.cached_tokens)]), counts,
                    [old + c for old, c in zip(res.old_lengths, res.cached_tokens)], [t.pages for t in session.tables],
                    (session.layers.start, session.layers.end), asyncio.get_running_loop().create_future(),
                    owner=session.session_id,
                )
                session.inflight = item.future  # closing the session cancels it (see SessionRegistry.close)
                output = await self.scheduler.submit(item)
            else:  # every new token came from shared pages
                output = hidden.new_empty((0, hidden.shape[1]))
        except BaseException:
            await self.registry.rollback(session, res)
            raise
        finally:
            session.inflight = None
        computed = torch.split(output, counts)
        if self.registry.sessions.get(session.session_id) is not session:
            raise ProtocolError("no_session", "the session was closed during the step")
        parts = []
        for i, (rows, shared) in enumerate(zip(computed, res.shared_pages)):
            if shared:
                parts.append(self.page_outputs.read(shared))
            if token_ids is not None and session.token_ids[i] is not None:
                # Keep the outputs of every position: a page registered later returns them to others.
                self.page_outputs.write(session.tables[i].pages, res.old_lengths[i] + res.cached_tokens[i], rows)
            parts.append(rows)
        self.registry.commit(session, token_ids)
        return self._maybe_corrupt(torch.cat(parts))

    def _maybe_corrupt(self, output: torch.Tensor) -> torch.Tensor:
        # TEST ONLY (`--faulty`, `--faulty-probability`): a lying peer, so client verification can be exercised.
        if self.faulty is not None and random.random() < self.faulty.probability:
            return output + self.faulty.std * torch.randn_like(output)
        return output



def check_push(session: PeerSession, push: Push, remote: str) -> None:
    """A push is accepted only from the peer the client named, carrying the token the client chose."""
    token = push.push_token
    if (session.push_from is None or remote != session.push_from
            or not hmac.compare_digest(token.encode(), session.push_token.encode())):
        raise ProtocolError("unauthorized", "this peer may not push into that session")
