"""The typed `layerswarm/v1` messages: one frozen dataclass per message, validated at the boundary.

`Cls.from_wire(msg, limits)` takes a decoded frame (untrusted; its "type" already matched) and
returns the message or raises ProtocolError naming the bad field; unknown fields are ignored,
so newer senders may add some. `msg.to_wire()` builds the dict that `PeerStream.send` frames.
What depends on the receiver's state (a session's batch size, the served hidden size and dtype)
is checked by the receiver after parsing. docs/protocol.md lists every message and field here;
tests/test_swarm_schema.py checks that both agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, ClassVar

import torch

from swarm import messages as m
from swarm.codec import Limits, encode_tensor
from swarm.errors import ProtocolError
from swarm.records import MAX_SUBKEY_BYTES, SignedRecord
from swarm.types import MAX_NUM_LAYERS

MAX_TOKEN_ID = 2**31 - 1  # token ids travel as non-negative int32 values
MAX_ID_LEN = 128  # peer ids, session ids, push tokens
# Pushed routes are at most this many hops, so `next` lists at most MAX_ROUTE_HOPS - 1 entries.
# 16 hops covers the largest open models (126 layers) at 8 layers per peer; each hop adds a
# network hop to every token, so longer routes are slow anyway, and a client with one relays
# its steps itself instead of pushing. The bound keeps one step's fan-out small.
MAX_ROUTE_HOPS = 16
MIN_PUSH_TOKEN = 16  # characters: a client-chosen secret nobody can guess
MAX_MODEL_NAME = 256
MAX_VIEW_RECORDS = 256  # a route needs a handful of peers; 256 covers a large swarm's candidates
# A signed PeerRecord: <= ~2.5 KiB of fields (PeerRecord.from_dict's bounds) + a base64 signature
# (<= 1.4 KiB for an 8192-bit key); a larger value is nobody's honest record.
MAX_SIGNED_VALUE = 8192

Layers = tuple[int, int]


def _bad(key: str, why: str) -> ProtocolError:
    return ProtocolError("bad_field", f"field {key!r}: {why}")


def _optional_id(msg: dict[str, Any], key: str = "session_id") -> str | None:
    return m.require_str(msg, key, max_len=MAX_ID_LEN) if key in msg else None


def _layers(msg: dict[str, Any]) -> Layers | None:
    return m.require_layers(msg) if "layers" in msg else None


def _hidden(msg: dict[str, Any], limits: Limits) -> torch.Tensor:
    return m.require_tensor(msg, "hidden", limits, ndim=2)


def parse_token_ids(msg: dict[str, Any], new_tokens: list[int]) -> list[list[int]] | None:
    """The optional `token_ids` field: per sequence, the token ids of its new positions."""
    value = msg.get("token_ids")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != len(new_tokens):
        raise _bad("token_ids", f"must be a list of {len(new_tokens)} lists of ints")
    for i, (ids, n) in enumerate(zip(value, new_tokens)):
        if not isinstance(ids, list) or len(ids) != n:
            raise _bad("token_ids", f"entry {i} must list {n} token ids (new_tokens[{i}])")
        if not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in ids):
            raise _bad("token_ids", f"entry {i} must hold ints in [0, {MAX_TOKEN_ID}]")
    return value


def parse_chain(msg: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The optional `next` field: [[peer_id, session_id, push_token], ...], the hops downstream."""
    chain = msg.get("next", [])
    if not isinstance(chain, list) or len(chain) >= MAX_ROUTE_HOPS:
        raise _bad("next", f"must be a list of at most {MAX_ROUTE_HOPS - 1} [peer_id, session_id, push_token] "
                   f"(routes of at most {MAX_ROUTE_HOPS} hops push)")
    hops = []
    for hop in chain:
        if not (isinstance(hop, list) and len(hop) == 3
                and all(isinstance(x, str) and 0 < len(x) <= MAX_ID_LEN for x in hop)):
            raise _bad("next", "each entry must be [peer_id, session_id, push_token] strings")
        hops.append((hop[0], hop[1], hop[2]))
    return hops


def parse_push_binding(msg: dict[str, Any]) -> tuple[str | None, str]:
    """(`push_from`, `push_token`): the upstream peer allowed to push, and the client's secret; (None, "") if absent."""
    if "push_from" not in msg:
        return None, ""
    push_from = m.require_str(msg, "push_from", max_len=MAX_ID_LEN)
    token = m.require_str(msg, "push_token", max_len=MAX_ID_LEN)
    if not push_from or len(token) < MIN_PUSH_TOKEN:
        raise ProtocolError("bad_field", f"push_from must name a peer and push_token must be a secret of "
                            f"{MIN_PUSH_TOKEN}..{MAX_ID_LEN} characters")
    return push_from, token


class Message:
    """Base of every message: `TYPE` on the wire, fields as dataclass fields (None = absent)."""

    TYPE: ClassVar[str]

    def to_wire(self, encoded: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The frame's dict. `encoded`: tensor fields already encoded (`encode_tensor`), taken as they are:
        a peer sends one output both as its `result` and in a `push`, and encodes (copies) it once."""
        out: dict[str, Any] = {"type": self.TYPE}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, torch.Tensor):
                value = encoded[f.name] if encoded and f.name in encoded else encode_tensor(value)
            elif isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else asdict(v) if is_dataclass(v) else v for v in value]
            out[f.name] = value
        return out


@dataclass(frozen=True)
class _NoFields(Message):
    """A message that is its type alone (`info` request, `authorized`)."""

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> _NoFields:
        return cls()


# ---- requests (client -> peer) -----------------------------------------------------------------
@dataclass(frozen=True)
class Info(_NoFields):
    TYPE: ClassVar[str] = m.INFO


@dataclass(frozen=True)
class Forward(Message):
    TYPE: ClassVar[str] = m.FORWARD
    hidden: torch.Tensor
    new_tokens: list[int]
    layers: Layers | None = None

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> Forward:
        new_tokens = m.require_int_list(msg, "new_tokens", min=1)
        if not new_tokens:
            raise _bad("new_tokens", "must list at least one sequence")
        hidden = _hidden(msg, limits)
        if hidden.shape[0] != sum(new_tokens):
            raise _bad("hidden", f"{hidden.shape[0]} rows but new_tokens sums to {sum(new_tokens)}")
        return cls(hidden, new_tokens, _layers(msg))


@dataclass(frozen=True)
class Open(Message):
    TYPE: ClassVar[str] = m.OPEN
    max_length: int
    session_id: str = ""  # empty: the peer picks one
    batch: int = 1
    layers: Layers | None = None
    push_from: str | None = None
    push_token: str | None = None

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> Open:
        push_from, push_token = parse_push_binding(msg)
        return cls(
            max_length=m.require_int(msg, "max_length", min=1),
            session_id=m.require_str(msg, "session_id", max_len=MAX_ID_LEN, default=""),
            batch=m.require_int(msg, "batch", min=1, default=1),
            layers=_layers(msg),
            push_from=push_from,
            push_token=push_token or None,
        )


@dataclass(frozen=True)
class Step(Message):
    TYPE: ClassVar[str] = m.STEP
    step_id: int
    hidden: torch.Tensor
    new_tokens: list[int]
    positions: list[int]
    token_ids: list[list[int]] | None = None
    next: tuple[tuple[str, str, str], ...] | None = None
    session_id: str | None = None  # default: the stream's only session
    push_from: str | None = None  # a changed upstream (after a failover) re-binds pushes
    push_token: str | None = None

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> Step:
        new_tokens = m.require_int_list(msg, "new_tokens", min=1)
        positions = m.require_int_list(msg, "positions", length=len(new_tokens), min=0)
        hidden = _hidden(msg, limits)
        if hidden.shape[0] != sum(new_tokens):
            raise _bad("hidden", f"{hidden.shape[0]} rows but new_tokens sums to {sum(new_tokens)}")
        push_from, push_token = parse_push_binding(msg)
        return cls(
            step_id=m.require_int(msg, "step_id", min=0), hidden=hidden, new_tokens=new_tokens,
            positions=positions, token_ids=parse_token_ids(msg, new_tokens), next=tuple(parse_chain(msg)) or None,
            session_id=_optional_id(msg),
            push_from=push_from, push_token=push_token or None,
        )


@dataclass(frozen=True)
class Truncate(Message):
    TYPE: ClassVar[str] = m.TRUNCATE
    length: int
    session_id: str | None = None

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> Truncate:
        return cls(m.require_int(msg, "length", min=0), _optional_id(msg))


@dataclass(frozen=True)
class _SessionOnly(Message):
    """A message whose one field is an optional session id (`close` and its reply `closed`)."""

    session_id: str | None = None  # default: the stream's only session

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> _SessionOnly:
        return cls(_optional_id(msg))


@dataclass(frozen=True)
class Close(_SessionOnly):
    TYPE: ClassVar[str] = m.CLOSE


@dataclass(frozen=True)
class View(Message):
    TYPE: ClassVar[str] = m.VIEW
    model: str | None = None  # default: the peer's own model

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> View:
        return cls(m.require_str(msg, "model", max_len=MAX_MODEL_NAME) if "model" in msg else None)


@dataclass(frozen=True)
class Auth(Message):
    TYPE: ClassVar[str] = m.AUTH
    proof: bytes

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> Auth:
        proof = msg.get("proof")
        if not isinstance(proof, bytes) or len(proof) > 64:
            raise _bad("proof", "expected at most 64 bytes")
        return cls(proof)


@dataclass(frozen=True)
class CrashNotice(Message):
    """`peer_id`, as announced at `announced` (its record's `updated`), does not answer the sender.

    A claim, never a verdict: the receiver probes the peer itself before balancing without it
    (peer/crash_notices.py, peer/crash_watch.py)."""

    TYPE: ClassVar[str] = m.CRASH_NOTICE
    peer_id: str
    announced: float

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> CrashNotice:
        announced = msg.get("announced")
        if type(announced) not in (int, float) or not math.isfinite(announced) or announced < 0:
            raise _bad("announced", "expected the suspect record's `updated` time, a finite number >= 0")
        return cls(m.require_str(msg, "peer_id", max_len=MAX_ID_LEN), float(announced))


# ---- peer -> peer ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Push(Message):
    TYPE: ClassVar[str] = m.PUSH
    session_id: str  # the downstream session
    push_token: str
    step_id: int
    hidden: torch.Tensor
    new_tokens: list[int]
    positions: list[int]
    token_ids: list[list[int]] | None = None
    next: tuple[tuple[str, str, str], ...] | None = None

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> Push:
        step = Step.from_wire(msg, limits)
        return cls(
            session_id=m.require_str(msg, "session_id", max_len=MAX_ID_LEN),
            push_token=m.require_str(msg, "push_token", max_len=MAX_ID_LEN, default=""),
            step_id=step.step_id, hidden=step.hidden, new_tokens=step.new_tokens, positions=step.positions,
            token_ids=step.token_ids, next=step.next,
        )


# ---- replies (peer -> client) ------------------------------------------------------------------
@dataclass(frozen=True)
class InfoReply(Message):
    TYPE: ClassVar[str] = m.INFO
    record: dict[str, Any]  # PeerRecord.to_dict(); PeerRecord.from_dict range-checks it
    stats: dict[str, Any]  # counters for display; the monitor sanitises them

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> InfoReply:
        return cls(m.require_map(msg, "record"), m.require_map(msg, "stats", optional=True) or {})


@dataclass(frozen=True)
class Opened(Message):
    TYPE: ClassVar[str] = m.OPENED
    session_id: str
    page_size: int

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> Opened:
        return cls(m.require_str(msg, "session_id", max_len=MAX_ID_LEN), m.require_int(msg, "page_size", min=1))


@dataclass(frozen=True)
class Result(Message):
    TYPE: ClassVar[str] = m.RESULT
    hidden: torch.Tensor
    step_id: int | None = None  # absent in answers to `forward`

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> Result:
        step_id = m.require_int(msg, "step_id", min=0) if "step_id" in msg else None
        return cls(_hidden(msg, limits), step_id)


@dataclass(frozen=True)
class Truncated(Message):
    TYPE: ClassVar[str] = m.TRUNCATED
    length: int

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> Truncated:
        return cls(m.require_int(msg, "length", min=0))


@dataclass(frozen=True)
class Closed(_SessionOnly):
    TYPE: ClassVar[str] = m.CLOSED


def parse_signed_record(obj: Any, index: int) -> SignedRecord:
    """One entry of a `view` reply's `records`: {subkey: bytes, value: bytes, expiration_time: float}.

    Only its shape and size are checked here; whether the signature verifies is the reader's
    own check (swarm.records.open_signed, or docs/protocol.md "Signed records").
    """
    where = f"records[{index}]"
    if not isinstance(obj, dict):
        raise _bad(where, "expected a map {subkey, value, expiration_time}")
    subkey, value, expiration = obj.get("subkey"), obj.get("value"), obj.get("expiration_time")
    if not isinstance(subkey, bytes) or not 0 < len(subkey) <= MAX_SUBKEY_BYTES:
        raise _bad(where, f"subkey must be 1..{MAX_SUBKEY_BYTES} bytes")
    if not isinstance(value, bytes) or not 0 < len(value) <= MAX_SIGNED_VALUE:
        raise _bad(where, f"value must be 1..{MAX_SIGNED_VALUE} bytes")
    if type(expiration) is not float or not math.isfinite(expiration):
        raise _bad(where, "expiration_time must be a finite float")
    return SignedRecord(subkey, value, expiration)


@dataclass(frozen=True)
class ViewReply(Message):
    TYPE: ClassVar[str] = m.VIEW
    model: str
    num_layers: int  # 0: no peer announces the model
    records: tuple[SignedRecord, ...]  # best first (peer/view.py), each exactly as its owner signed it
    truncated: bool  # some records were left out (bounds)

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> ViewReply:
        records = msg.get("records")
        if not isinstance(records, list) or len(records) > MAX_VIEW_RECORDS:
            raise _bad("records", f"expected a list of at most {MAX_VIEW_RECORDS} signed records")
        return cls(m.require_str(msg, "model", max_len=MAX_MODEL_NAME),
                   m.require_int(msg, "num_layers", min=0, max=MAX_NUM_LAYERS),
                   tuple(parse_signed_record(r, i) for i, r in enumerate(records)), m.require_bool(msg, "truncated"))


@dataclass(frozen=True)
class Authorized(_NoFields):
    TYPE: ClassVar[str] = m.AUTHORIZED


@dataclass(frozen=True)
class Noted(_NoFields):
    TYPE: ClassVar[str] = m.NOTED


@dataclass(frozen=True)
class Error(Message):
    TYPE: ClassVar[str] = m.ERROR
    code: str
    message: str = ""
    retryable: bool = False

    @classmethod
    def from_wire(cls, msg: dict[str, Any], limits: Limits) -> Error:
        return cls(m.require_str(msg, "code", max_len=64), m.require_str(msg, "message", max_len=2**16, default=""),
                   m.require_bool(msg, "retryable", default=False))


REQUESTS: dict[str, type[Message]] = {
    c.TYPE: c for c in (Info, Forward, Open, Step, Truncate, Close, View, Auth, Push, CrashNotice)
}
REPLIES: dict[str, type[Message]] = {
    c.TYPE: c for c in (InfoReply, Opened, Result, Truncated, Closed, Authorized, Error, ViewReply, Noted)
}


def parse_request(msg: dict[str, Any], limits: Limits) -> Message:
    """A request of any known type, validated; unknown types are `unknown_type` errors."""
    cls = REQUESTS.get(m.require_type(msg))
    if cls is None:
        raise ProtocolError("unknown_type", f"{msg['type']!r:.40} is not a request")
    return cls.from_wire(msg, limits)


def parse_reply(msg: dict[str, Any], limits: Limits, expected: type[Message]) -> Message:
    """The reply `expected`; any other type is a `bad_reply` (an `error` frame was already raised by recv)."""
    if msg.get("type") != expected.TYPE:
        raise ProtocolError("bad_reply", f"expected {expected.TYPE!r}, got {describe_type(msg)}")
    return expected.from_wire(msg, limits)


def describe_type(msg: dict[str, Any]) -> str:
    kind = msg.get("type")
    return repr(kind[:40]) if isinstance(kind, str) else type(kind).__name__
