"""`InferenceSession`: one generation's state across the swarm, with failover.

A session holds a route (one `HopSession` per hop). A step sends the hidden states through the
hops in order: the client relays between hops, or (push mode, decode steps) hands them the
chain so each peer pushes straight to the next while still returning its output to us.

When a hop fails (stream dropped, retryable error, timeout), the client bans that peer, plans
a new route for that hop's layers only, replays the hop's recorded inputs into the new peers
to rebuild their KV cache, and carries on: the output is the same as without the failure.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial

import torch

from client.errors import SwarmError, is_hop_failure
from client.hop import HopSession
from client.stall import stall_wait, unless_gone
from client.swarm_client import SwarmClient
from client.verify import check_step, fingerprint_outliers
from routing import NoRouteError
from swarm.errors import PeerUnreachable, RemoteError
from swarm.schema import MAX_ROUTE_HOPS

logger = logging.getLogger(__name__)


@dataclass
class SessionStats:
    steps: int = 0
    failovers: int = 0
    retries: int = 0
    caught: int = 0  # hops caught returning wrong results (see client/verify.py)
    inconclusive: int = 0  # verifications where peers disagreed and nothing decided who was right


class InferenceSession:
    """Use as a context manager; `step` runs on the caller's thread and waits for the swarm."""

    def __init__(self, swarm: SwarmClient, max_length: int, batch: int = 1, push: bool | None = None) -> None:
        self.swarm = swarm
        self.push = swarm.config.push if push is None else push
        self.max_length = max_length
        self.batch = batch
        self.hops: list[HopSession] = []
        self.lengths = [0] * batch  # tokens each sequence holds on the peers
        self.stats = SessionStats()
        self.failures: Counter[str] = Counter()  # by peer id
        self._next_id = 0
        self._rng = random.Random()  # which steps get verified: unpredictable to the peers
        self.closed = False
        # Generation bookkeeping kept across `generate(..., session=...)` calls (multi-turn):
        self.token_ids: list[list[int]] = [[] for _ in range(batch)]  # every token seen per sequence
        self.pending: list[list[int]] = [[] for _ in range(batch)]  # sampled, not yet sent through

    # -- sync facade ---------------------------------------------------------------------------
    def step(
        self, hidden: torch.Tensor, new_tokens: list[int], token_ids: list[list[int]] | None = None
    ) -> torch.Tensor:
        """hidden (N, H), N = sum(new_tokens) -> (N, H) after all layers.

        `token_ids` (optional): per sequence, the token ids of its new positions. Peers use them to
        share the KV pages of common prefixes (a system prompt is computed once per peer).
        """
        if self.closed:
            raise SwarmError("this inference session is closed; open a new one with model.inference_session()")
        if len(new_tokens) != self.batch:
            raise ValueError(f"session holds {self.batch} sequences, step has {len(new_tokens)}")
        if max(done + n for done, n in zip(self.lengths, new_tokens)) > self.max_length:
            raise ValueError(
                f"step would exceed the session's max_length={self.max_length}; "
                "open the session with a larger max_length"
            )
        if token_ids is not None:
            token_ids = [[int(t) for t in ids] for ids in token_ids]
            if len(token_ids) != self.batch or [len(ids) for ids in token_ids] != list(new_tokens):
                raise ValueError(f"token_ids must list new_tokens={new_tokens} ids per sequence")
        timeout = self.swarm.config.step_timeout * (self.swarm.config.max_retries + 2) + 60
        out = self.swarm.loop.run(self._step(hidden.to("cpu", torch.float32), new_tokens, self.push, token_ids),
                                  timeout=timeout)
        self.lengths = [done + n for done, n in zip(self.lengths, new_tokens)]
        self.stats.steps += 1
        return out

    def truncate(self, length: int) -> None:
        """Forget tokens past `length` in every sequence (rejected speculative tokens)."""
        timeout = self.swarm.config.step_timeout

        async def cut_all() -> None:
            results = await asyncio.gather(*(h.truncate(length, timeout) for h in self.hops), return_exceptions=True)
            for hop, result in zip(self.hops, results):
                if isinstance(result, BaseException):
                    if not is_hop_failure(result):
                        raise result
                    # The peer died here: cut its inputs locally and drop it; the next step
                    # fails over and replays the truncated history into a replacement.
                    hop.cut_history(length)
                    await hop.close()

        self.swarm.loop.run(cut_all(), timeout=timeout + 5)
        self.lengths = [min(done, length) for done in self.lengths]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True  # the closed hops stay listed: they describe the route that was used
        async def close_all() -> None:
            await asyncio.gather(*(h.close() for h in self.hops), return_exceptions=True)

        try:
            self.swarm.loop.run(close_all(), timeout=10)
        except Exception:
            pass  # peers free a session's pages when its stream goes away anyway

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- async core ------------------------------------------------------------------------------
    def _should_verify(self) -> bool:
        return self.swarm.config.verify > 0 and self._rng.random() < self.swarm.config.verify

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    @property
    def _timeout(self) -> float:
        return self.swarm.config.step_timeout

    async def _step(
        self, hidden: torch.Tensor, new_tokens: list[int], push: bool, token_ids: list[list[int]] | None = None
    ) -> torch.Tensor:
        if not self.hops:
            self.hops = await self._open_route()
        step_id = self._new_id()
        index, x = 0, hidden
        # Verification compares each hop's output before the next hop uses it: relay only. A hop whose
        # upstream changed (failover) is re-bound by the next relayed step before pushes resume.
        # Peers refuse push chains of longer routes; those are relayed.
        if (push and not self.swarm.config.verify and 1 < len(self.hops) <= MAX_ROUTE_HOPS and self.lengths[0] > 0
                and all(h.upstream == self._upstream(i) for i, h in enumerate(self.hops) if i)):
            index, x = await self._push_step(x, new_tokens, step_id, token_ids)
        attempts = 0
        while index < len(self.hops):
            hop = self.hops[index]
            try:
                sent = time.perf_counter()
                await hop.send_step(x, new_tokens, step_id, token_ids=token_ids, upstream=self._upstream(index))
                y = await self._result(hop, step_id, new_tokens)
                self._measure(hop, new_tokens, time.perf_counter() - sent)
            except Exception as e:
                if not is_hop_failure(e):
                    raise self._user_error(hop, e) from e
                attempts += 1
                self.stats.retries += 1
                if attempts > self.swarm.config.max_retries:
                    raise SwarmError(f"layers {hop.layers} failed {attempts} times; last error: {e}") from e
                await self._replace(index, e, attempts)
                continue
            if self._should_verify():
                verdict = await check_step(self.swarm, hop, x, new_tokens, y,
                                           exclude=fingerprint_outliers(await self.swarm.view()))
                if verdict.liar is not None:
                    self.stats.caught += 1
                    await self.swarm.distrust(verdict.liar, f"wrong output for layers {hop.layers}")
                if verdict.inconclusive:
                    self.stats.inconclusive += 1
                if not verdict.use:  # redo this hop's step elsewhere; never use a disputed output
                    attempts += 1
                    if attempts > self.swarm.config.max_retries:
                        raise SwarmError(f"layers {hop.layers}: peers kept disagreeing on the result "
                                         f"({attempts} attempts); not using a disputed output")
                    await self._replace(index, SwarmError("result disputed by verification"), attempts)
                    continue
            hop.record_inputs(x, new_tokens, token_ids)
            x = y
            index += 1
        return x

    async def _open_route(self) -> list[HopSession]:
        """The first route of the session; a dead peer in a stale view is banned and re-planned."""
        for attempt in range(1, self.swarm.config.max_retries + 1):
            try:
                return await self._open_span(0, self.swarm.num_layers, history=None)
            except NoRouteError as e:
                raise SwarmError(str(e)) from e
            except Exception as e:
                if not is_hop_failure(e) or attempt == self.swarm.config.max_retries:
                    raise
                self.stats.retries += 1
                logger.warning("opening a route failed (%s); retrying", e)
                await asyncio.sleep(self.swarm.config.retry_backoff * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    async def _push_step(
        self, x: torch.Tensor, new_tokens: list[int], step_id: int, token_ids: list[list[int]] | None = None
    ) -> tuple[int, torch.Tensor]:
        """Send once; each hop pushes to the next. Returns (first hop that did not answer, its input)."""
        chain = [(h.peer_id, h.session_id, h.push_token) for h in self.hops[1:]]
        last = time.perf_counter()
        try:
            await self.hops[0].send_step(x, new_tokens, step_id, chain, token_ids)
        except Exception as e:
            if not is_hop_failure(e):
                raise
            return 0, x
        for index, hop in enumerate(self.hops):
            try:
                y = await self._result(hop, step_id, new_tokens)
            except Exception as e:
                if not is_hop_failure(e):
                    raise self._user_error(hop, e) from e
                logger.info("push through %s failed at step %d (%s); relaying from here", hop, step_id, e)
                if isinstance(e, PeerUnreachable):  # gone: relaying to it again would wait out another probe
                    await self._replace(index, e, 1)
                return index, x
            now = time.perf_counter()  # hop i's result follows hop i-1's by its compute and one transfer
            self._measure(hop, new_tokens, now - last)
            last = now
            hop.record_inputs(x, new_tokens, token_ids)
            x = y
        return len(self.hops), x

    async def _result(self, hop: HopSession, step_id: int, new_tokens: list[int]) -> torch.Tensor:
        """`hop`'s result of step `step_id`; a hop silent for a while is probed, and one that does not
        answer raises PeerUnreachable at once, not at step_timeout (client/stall.py). The while is
        ClientConfig.stall_probe_s, or for a decode step through a peer whose decode steps were timed
        (client/measured.py), four of them but at least ClientConfig.stall_probe_min_s (stall_wait)."""
        config = self.swarm.config
        usual = (self.swarm.measured.expected_seconds(hop.peer_id, len(hop.layers), len(new_tokens))
                 if all(n == 1 for n in new_tokens) else None)
        wait = stall_wait(usual, config.stall_probe_min_s, config.stall_probe_s)
        return await unless_gone(hop.recv_result(step_id, self._timeout),
                                 partial(self.swarm.is_alive, hop.peer_id, timeout=wait), hop.peer_id, wait,
                                 self._timeout)

    def _measure(self, hop: HopSession, new_tokens: list[int], seconds: float) -> None:
        """Decode steps only: a prefill's tokens/s says little about a peer's decode speed."""
        if all(n == 1 for n in new_tokens):
            self.swarm.measured.observe(hop.peer_id, len(hop.layers), len(new_tokens), seconds)

    async def _replace(self, index: int, error: BaseException, attempt: int) -> None:
        """Swap hop `index` for a freshly planned route over its layers, replaying its inputs."""
        hop = self.hops[index]
        self.stats.failovers += 1
        self.failures[hop.peer_id] += 1
        logger.warning("peer %s failed on layers %s (%s: %s); rerouting", hop.peer_id, hop.layers,
                       type(error).__name__, error)
        self.swarm.ban(hop.peer_id, error)
        await hop.close()
        await asyncio.sleep(min(self.swarm.config.retry_backoff * 2 ** (attempt - 1), 10.0))
        try:
            new_hops = await self._open_span(hop.layers.start, hop.layers.end, history=hop.history,
                                             history_ids=hop.history_token_ids(), upstream=self._upstream(index))
        except Exception as e:
            if isinstance(e, NoRouteError) or is_hop_failure(e):
                logger.warning("rerouting layers %s failed: %s", hop.layers, e)
                return  # the step loop retries this index (with the closed hop) up to max_retries
            raise
        self.hops[index : index + 1] = new_hops

    async def _open_span(
        self, start: int, end: int, history: list[list[torch.Tensor]] | None,
        history_ids: list[list[int]] | None = None, upstream: str | None = None,
    ) -> list[HopSession]:
        """Open hops covering [start, end); replay `history` (inputs of layer `start`) into them.

        `history_ids` (the token ids of those rows, if known) go with the replay, so the new peers
        can attach cached prefix pages instead of recomputing them. `upstream`: the peer of the hop
        before `start`, which alone may push into the first new hop (each later one: the one before it).
        """
        route = await self.swarm.plan(start, end, fresh=history is not None,
                                      exclude=fingerprint_outliers(await self.swarm.view()))
        view = await self.swarm.view()
        hops: list[HopSession] = []
        x, new_tokens = None, None
        if history is not None and any(history):
            per_seq = [torch.cat(chunks) for chunks in history]
            x, new_tokens = torch.cat(per_seq), [t.shape[0] for t in per_seq]
        try:
            for planned in route:
                hop = HopSession(view.records[planned.peer_id], planned.layers, self.batch, self.max_length)
                hops.append(hop)
                await asyncio.wait_for(hop.open(self.swarm.open_stream, self._timeout, upstream),
                                       self.swarm.config.connect_timeout + self._timeout)
                upstream = hop.peer_id
                if x is not None:
                    replay_id = self._new_id()
                    await hop.send_step(x, new_tokens, replay_id, token_ids=history_ids)
                    y = await self._result(hop, replay_id, new_tokens)
                    hop.record_inputs(x, new_tokens, history_ids)
                    x = y
        except Exception as e:
            if hops and is_hop_failure(e):
                self.swarm.ban(hops[-1].peer_id, e)
            await asyncio.gather(*(h.close() for h in hops), return_exceptions=True)
            raise
        return hops

    def _upstream(self, index: int) -> str | None:
        return self.hops[index - 1].peer_id if index > 0 else None

    def _user_error(self, hop: HopSession, error: BaseException) -> BaseException:
        if isinstance(error, RemoteError):
            return SwarmError(f"peer {hop.peer_id} refused the request: {error.message} ({error.code})")
        return error

