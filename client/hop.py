"""`HopSession`: one peer's part of an inference session, and the inputs it was sent.

The inputs are kept per sequence, so when the peer dies a replacement can be rebuilt by
replaying them as one prefill; `truncate` cuts them like the peer cuts its cache. Token ids
sent with the steps are kept too (`token_history`), so the replay lets the replacement share
cached prefix pages as well.

Push binding: each hop has a secret `push_token` chosen here; `open` (or, after the hop before
it was replaced, the next relayed step) tells the peer which upstream peer may push into the
session and with which token, so nobody else who learns the session id can inject steps.
Results are checked before use: the row count of the step, the hidden size sent, all finite;
a bad result is a hop failure (`bad_reply`), so the session bans the peer and fails over.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Awaitable, Callable

import torch

from swarm import messages as m
from swarm.codec import DTYPES, all_finite
from swarm.connection import PeerStream
from swarm.errors import ConnectionClosed, ProtocolError, RemoteError
from swarm.schema import Close, Open, Opened, Result, Step, Truncate, parse_reply
from swarm.types import LayerRange, PeerRecord

# Activation dtypes a peer may announce, from the one wire dtype table.
TORCH_DTYPES = {name: dtype for name, (dtype, _) in DTYPES.items() if dtype.is_floating_point}


def split_rows(hidden: torch.Tensor, new_tokens: list[int]) -> list[torch.Tensor]:
    """(N, H) ragged rows -> one (n_b, H) tensor per sequence."""
    return list(torch.split(hidden, new_tokens))


class HopSession:
    def __init__(self, record: PeerRecord, layers: LayerRange, batch: int, max_length: int) -> None:
        self.record = record
        self.peer_id = record.peer_id
        self.layers = layers
        self.batch = batch
        self.max_length = max_length
        self.session_id = uuid.uuid4().hex
        self.wire_dtype = TORCH_DTYPES.get(record.dtype, torch.float32)
        self.history: list[list[torch.Tensor]] = [[] for _ in range(batch)]  # inputs per sequence
        # Token ids of those inputs per sequence; None once a step came without them.
        self.token_history: list[list[int] | None] = [[] for _ in range(batch)]
        self.lengths = [0] * batch
        self.stream: PeerStream | None = None
        self.push_token = secrets.token_hex(16)
        self.upstream: str | None = None  # the peer this session accepts pushes from (told to the peer)
        self._expected: dict[int, tuple[int, int]] = {}  # step id -> (rows, hidden size) of its result

    def __repr__(self) -> str:
        return f"HopSession({self.peer_id[-8:]}, layers {self.layers})"

    def _stream(self) -> PeerStream:
        if self.stream is None:
            raise ConnectionClosed(f"session with {self.peer_id} is closed", clean=True)
        return self.stream

    async def open(
        self, open_stream: Callable[[str], Awaitable[PeerStream]], timeout: float, upstream: str | None = None
    ) -> None:
        """`upstream`: the peer of the hop before this one, the only one allowed to push into it."""
        self.stream = await open_stream(self.peer_id)
        request = Open(self.max_length, self.session_id, self.batch, (self.layers.start, self.layers.end),
                       push_from=upstream, push_token=self.push_token if upstream is not None else None)
        reply = await self.stream.request(request.to_wire(), timeout)
        self.upstream = upstream
        try:
            parse_reply(reply, self.stream.limits, Opened)
        except ProtocolError as e:
            raise RemoteError("bad_reply", e.message, True, self.peer_id) from e

    async def send_step(
        self,
        hidden: torch.Tensor,
        new_tokens: list[int],
        step_id: int,
        chain: list[tuple[str, str, str]] = (),
        token_ids: list[list[int]] | None = None,
        upstream: str | None = None,
    ) -> None:
        """`token_ids` (optional, per sequence: the ids of its new positions) let the peer share prefix pages.

        `chain`: (peer id, session id, push token) of the hops after this one, for push mode.
        `upstream`: the peer of the hop before this one now; a change (failover) re-binds pushes.
        """
        stream = self._stream()
        rebind = upstream is not None and upstream != self.upstream
        step = Step(step_id, hidden.to(self.wire_dtype), list(new_tokens), list(self.lengths),
                    token_ids=None if token_ids is None else [list(map(int, ids)) for ids in token_ids],
                    next=tuple(tuple(hop) for hop in chain) or None,
                    push_from=upstream if rebind else None, push_token=self.push_token if rebind else None)
        if rebind:
            self.upstream = upstream
        self._expected = {step_id: (hidden.shape[0], hidden.shape[1])}  # one step in flight per hop
        await stream.send(step.to_wire())

    async def recv_result(self, step_id: int, timeout: float) -> torch.Tensor:
        """The hidden states of step `step_id`, skipping leftovers of earlier steps."""
        stream = self._stream()
        while True:
            try:
                reply = await stream.recv(timeout)
            except RemoteError as e:
                if e.code == "push_failed":
                    continue  # about the NEXT hop, which the client notices on that hop's stream
                raise
            if reply.get("type") == m.RESULT and reply.get("step_id") == step_id:
                try:
                    hidden = Result.from_wire(reply, stream.limits).hidden
                except ProtocolError as e:  # a malformed result is the peer's failure, like a wrong one
                    raise RemoteError("bad_reply", f"result of step {step_id}: {e}", True, self.peer_id) from e
                self._check_result(step_id, hidden)
                return hidden.to(torch.float32)
            if reply.get("type") == m.RESULT and isinstance(reply.get("step_id"), int) and reply["step_id"] < step_id:
                continue
            raise RemoteError("bad_reply", f"unexpected reply {reply.get('type')!r} to step {step_id}", True, self.peer_id)

    def _check_result(self, step_id: int, hidden: torch.Tensor) -> None:
        """A result of the wrong shape or with NaN/inf is this peer's failure: it gets banned, never used."""
        expected = self._expected.get(step_id)
        why = None
        if expected is not None and tuple(hidden.shape) != expected:
            why = f"result of step {step_id} has shape {tuple(hidden.shape)}, expected {expected}"
        elif hidden.is_floating_point() and not all_finite(hidden):
            why = f"result of step {step_id} contains NaN or infinity"
        elif not hidden.is_floating_point():
            why = f"result of step {step_id} has dtype {hidden.dtype}, not a float type"
        if why is not None:
            raise RemoteError("bad_reply", why, True, self.peer_id)

    def record_inputs(
        self, hidden: torch.Tensor, new_tokens: list[int], token_ids: list[list[int]] | None = None
    ) -> None:
        """Remember a step's inputs (after the peer accepted it) for a future replay."""
        for seq, rows in enumerate(split_rows(hidden, new_tokens)):
            self.history[seq].append(rows)
            self.lengths[seq] += rows.shape[0]
            known = self.token_history[seq]
            if known is not None and token_ids is not None:
                known.extend(int(t) for t in token_ids[seq])
            else:
                self.token_history[seq] = None

    def history_token_ids(self) -> list[list[int]] | None:
        """Token ids of every recorded input row (for a replay), or None if some are unknown."""
        lengths = [sum(rows.shape[0] for rows in chunks) for chunks in self.history]
        ids = []
        for known, n in zip(self.token_history, lengths):
            if known is None or len(known) < n:
                return None
            ids.append(known[:n])  # the rows may have been cut without the ids (speculative.cut_history)
        return ids

    def history_batch(self) -> tuple[torch.Tensor, list[int]] | None:
        """All inputs so far as one ragged step, or None when nothing was sent yet."""
        if not any(self.history):
            return None
        per_seq = [torch.cat(chunks) for chunks in self.history]
        return torch.cat(per_seq), [t.shape[0] for t in per_seq]

    async def truncate(self, length: int, timeout: float) -> None:
        await self._stream().request(Truncate(length).to_wire(), timeout)
        self.cut_history(length)

    def cut_history(self, length: int) -> None:
        """Forget recorded inputs past `length` (what the peer forgot on `truncate`)."""
        for seq in range(self.batch):
            kept = torch.cat(self.history[seq])[:length] if self.history[seq] else None
            self.history[seq] = [kept] if kept is not None and kept.shape[0] else []
            self.lengths[seq] = min(self.lengths[seq], length)
            if self.token_history[seq] is not None:
                del self.token_history[seq][length:]

    async def close(self) -> None:
        if self.stream is None:
            return
        stream, self.stream = self.stream, None
        try:
            if not stream.closed:
                await stream.send(Close().to_wire())
        except Exception:
            pass  # the peer frees the session when the stream goes away anyway
        await stream.close()
