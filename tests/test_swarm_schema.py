"""The typed message schema (swarm/schema.py): round trips, boundary validation, and docs/protocol.md agreement."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from swarm import schema as s
from swarm.codec import Limits, decode_message, encode_message, encode_tensor
from swarm.errors import ProtocolError
from swarm.messages import ERROR_CODES, REPLY_TYPES, REQUEST_TYPES
from swarm.records import SignedRecord

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
LIMITS = Limits()
ROW = re.compile(r"^\| `(\w+)` \| (request|reply|peer -> peer) \| (.*) \|$")


def documented_messages() -> dict[tuple[str, str], set[str]]:
    """(type, direction) -> field names, from the message table of docs/protocol.md."""
    out = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            kind, direction, columns = match.groups()
            columns = re.sub(r"\([^()]*\)", "", columns)  # remarks in parentheses name no fields
            # field names are the backticked words directly followed by `?`, `:` or the closing backtick
            names = set(re.findall(r"`(\w+)\??(?::[^`]*)?`", columns))
            out[(kind, "request" if direction != "reply" else "reply")] = names
    return out


def schema_messages() -> dict[tuple[str, str], set[str]]:
    out = {(kind, "request"): {f.name for f in fields(cls)} for kind, cls in s.REQUESTS.items()}
    out.update({(kind, "reply"): {f.name for f in fields(cls)} for kind, cls in s.REPLIES.items()})
    return out


def test_doc_and_schema_list_the_same_messages_and_fields() -> None:
    documented, schema = documented_messages(), schema_messages()
    assert set(documented) == set(schema), "messages in only one of docs/protocol.md and swarm/schema.py"
    for key, names in schema.items():
        assert documented[key] == names, f"{key}: doc lists {sorted(documented[key])}, schema {sorted(names)}"


def test_schema_covers_the_message_vocabulary() -> None:
    assert set(s.REQUESTS) == REQUEST_TYPES
    assert set(s.REPLIES) == REPLY_TYPES


def test_every_error_code_is_documented() -> None:
    documented = set(re.findall(r"^\| `(\w+)` \| (?:yes|no) \|", DOC.read_text(), re.M))
    assert documented == set(ERROR_CODES)


def wire(msg: s.Message) -> dict:
    return decode_message(encode_message(msg.to_wire()), LIMITS)


def test_round_trips() -> None:
    hidden = torch.randn(3, 8)
    msgs = [
        s.Info(), s.Forward(hidden, [3], (0, 2)), s.Open(64, "sess", 2, (1, 3), "peer", "t" * 16),
        s.Step(5, hidden, [2, 1], [4, 7], [[1, 2], [3]], (("p", "q", "r" * 16),), "sess"),
        s.Push("sess", "t" * 16, 5, hidden, [3], [0]), s.Truncate(4), s.Close("sess"), s.View("m"),
        s.Auth(b"\x01" * 32), s.CrashNotice("peer", 1.7e9),
    ]
    for msg in msgs:
        back = s.parse_request(wire(msg), LIMITS)
        assert type(back) is type(msg)
        for f in fields(msg):
            a, b = getattr(msg, f.name), getattr(back, f.name)
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, f.name
    for reply in [s.Opened("sess", 16), s.Result(hidden, 5), s.Result(hidden), s.Truncated(3), s.Closed("x"),
                  s.Authorized(), s.Noted(), s.Error("busy", "full", True), s.InfoReply({"peer_id": "x"}, {"n": 1}),
                  s.ViewReply("m", 30, (SignedRecord(b"\xa3k[o", b"v[signature:x]", 1e9),), truncated=True)]:
        back = s.parse_reply(wire(reply), LIMITS, type(reply))
        assert type(back) is type(reply)
        if not isinstance(reply, s.Result):
            assert back == reply


def test_an_encoded_tensor_is_sent_as_it_is() -> None:
    """A peer's output goes out as `result` and in a `push`: encoded (copied) once, not twice."""
    hidden = torch.randn(2, 4)
    encoded = encode_tensor(hidden)
    push = s.Push("sess", "t" * 16, 1, hidden, [2], [0])
    assert push.to_wire({"hidden": encoded})["hidden"] is encoded
    assert push.to_wire()["hidden"] == encoded and push.to_wire()["hidden"] is not encoded


def test_unknown_fields_are_tolerated() -> None:
    msg = wire(s.Truncate(4))
    msg["from_the_future"] = {"x": [1]}
    assert s.parse_request(msg, LIMITS) == s.Truncate(4)


@pytest.mark.parametrize("msg, code", [
    ({"type": "teleport"}, "unknown_type"),
    ({"type": "open"}, "bad_field"),
    ({"type": "open", "max_length": 8, "push_from": "p", "push_token": "short"}, "bad_field"),
    ({"type": "truncate", "length": -1}, "bad_field"),
    ({"type": "close", "session_id": 5}, "bad_field"),
    ({"type": "auth", "proof": "not bytes"}, "bad_field"),
    ({"type": "crash_notice", "announced": 1.0}, "bad_field"),
    ({"type": "crash_notice", "peer_id": "p", "announced": float("nan")}, "bad_field"),
    ({"type": "crash_notice", "peer_id": "p", "announced": -1.0}, "bad_field"),
    ({"type": "crash_notice", "peer_id": "p", "announced": "1.0"}, "bad_field"),
    ({"type": "crash_notice", "peer_id": "p", "announced": True}, "bad_field"),
])
def test_bad_requests_are_refused_at_the_boundary(msg: dict, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        s.parse_request(msg, LIMITS)
    assert info.value.code == code


def step(**changes) -> dict:
    msg = wire(s.Step(0, torch.zeros(3, 4), [2, 1], [0, 0], [[1, 2], [3]]))
    msg.update(changes)
    return msg


@pytest.mark.parametrize("changes", [
    {"token_ids": [[1, 2]]}, {"token_ids": [[1], [3]]}, {"token_ids": [[1, -2], [3]]},
    {"token_ids": [[1, 2**31], [3]]}, {"token_ids": [[1, True], [3]]}, {"token_ids": "x"},
    {"next": [["p", "s"]]}, {"next": [["p", "s", ""]]}, {"next": [["p", "s", "t" * 129]]},
    {"next": [["p", "s", "t"]] * 16}, {"next": {"p": "s"}},
    {"positions": [0]}, {"new_tokens": [3]}, {"step_id": -1}, {"push_from": "p"},
])
def test_step_fields_are_checked(changes: dict) -> None:
    with pytest.raises(ProtocolError) as info:
        s.Step.from_wire(step(**changes), LIMITS)
    assert info.value.code in ("bad_field", "bad_tensor")


def test_close_and_closed_share_one_parser() -> None:
    assert s.Close.from_wire.__func__ is s.Closed.from_wire.__func__
    assert s.parse_reply({"type": "closed", "session_id": "a"}, LIMITS, s.Closed) == s.Closed("a")
    assert s.parse_request({"type": "close"}, LIMITS) == s.Close()


def view_reply(**changes) -> dict:
    msg = wire(s.ViewReply("m", 4, (SignedRecord(b"\xa1k", b"v", 1e9),), False))
    msg.update(changes)
    return msg


@pytest.mark.parametrize("changes", [
    {"records": "x"}, {"records": [{}] * (s.MAX_VIEW_RECORDS + 1)}, {"records": [5]},
    {"records": [{"subkey": "str", "value": b"v", "expiration_time": 1e9}]},
    {"records": [{"subkey": b"k", "value": b"v" * (s.MAX_SIGNED_VALUE + 1), "expiration_time": 1e9}]},
    {"records": [{"subkey": b"k", "value": b"v", "expiration_time": 10**9}]},
    {"records": [{"subkey": b"k", "value": b"v", "expiration_time": float("nan")}]},
    {"num_layers": -1}, {"model": 7}, {"truncated": "no"},
])
def test_view_reply_fields_are_checked(changes: dict) -> None:
    assert s.ViewReply.from_wire(view_reply(), LIMITS).num_layers == 4
    with pytest.raises(ProtocolError) as info:
        s.ViewReply.from_wire(view_reply(**changes), LIMITS)
    assert info.value.code == "bad_field"


def test_reply_of_the_wrong_type_is_a_bad_reply() -> None:
    with pytest.raises(ProtocolError) as info:
        s.parse_reply({"type": "closed"}, LIMITS, s.Opened)
    assert info.value.code == "bad_reply"
