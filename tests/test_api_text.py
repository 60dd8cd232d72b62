"""The gateway's pure parts: streaming detokenization, stop strings, request parsing, error mapping.

The detokenizer runs on SmolLM2's real tokenizer (byte-level BPE: emoji and CJK characters span
several tokens), and every stream of deltas must join to exactly the full decode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from client.api.errors import ApiError, from_generation_error
from client.api.schema import parse_chat, parse_completion
from client.api.text import Detokenizer, StopScanner
from client.errors import SwarmError
from routing import NoRouteError
from swarm.errors import RemoteError

pytestmark = pytest.mark.demo_model


@pytest.fixture(scope="module")
def tokenizer(demo_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model)


@pytest.mark.parametrize("text", ["Hello, world! How are you?", "Crème brûlée 🍮🎉 and 東京タワー.", "a  b\n\n  c\t🙂"])
def test_deltas_join_to_the_full_decode(tokenizer: Any, text: str) -> None:
    prompt = tokenizer("<|im_start|>assistant\n").input_ids
    ids = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    detok = Detokenizer(tokenizer, prompt)
    deltas = [detok.add([t]) for t in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in d for d in deltas)  # half characters are never sent
    if "🍮" in text:
        assert len(tokenizer("🍮", add_special_tokens=False).input_ids) > 1  # the case worth testing
        assert "" in deltas[:-1]  # some token completed no character


def test_special_tokens_never_reach_the_text(tokenizer: Any) -> None:
    ids = tokenizer("Hi<|im_end|>\n<|im_start|>user", add_special_tokens=False).input_ids
    detok = Detokenizer(tokenizer, [])
    text = "".join(detok.add([t]) for t in ids) + detok.flush()
    assert "<|im" not in text and text.startswith("Hi")


def feed_all(stop: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    scanner = StopScanner(stop)
    sent = [scanner.feed(p) for p in pieces]
    sent.append(scanner.flush())
    return sent, scanner.stopped


def test_stop_string_is_cut_and_never_partly_sent() -> None:
    sent, stopped = feed_all(("END",), ["Hello ", "E", "N", "D", " more"])
    assert "".join(sent) == "Hello " and stopped
    assert sent[1:3] == ["", ""]  # "E", "EN" held back: they could start the stop string
    sent, stopped = feed_all(("END",), ["Hello ", "E", "N", "o"])  # a false start is released
    assert "".join(sent) == "Hello ENo" and not stopped
    sent, stopped = feed_all(("xy", "b"), ["aaxb", "yxy"])  # the earliest match wins
    assert "".join(sent) == "aax" and stopped
    sent, stopped = feed_all(("E",), ["abc", "dE"])
    assert sent[:2] == ["abc", "d"] and stopped
    assert feed_all((), ["a", "b"]) == (["a", "b", ""], False)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_parse_chat_accepts_openai_shapes() -> None:
    req = parse_chat({**CHAT, "messages": [{"role": "system", "content": [{"type": "text", "text": "be "},
                                                                            {"type": "text", "text": "brief"}]},
                                           {"role": "user", "content": "hi"}],
                      "max_completion_tokens": 5, "temperature": 0, "stop": "x", "seed": 3, "stream": True,
                      "stream_options": {"include_usage": True}, "user": "someone", "n": 1})
    assert req.messages[0].content == "be brief" and req.sampling.max_tokens == 5
    assert req.sampling.stop == ("x",) and req.sampling.include_usage and req.sampling.temperature == 0.0
    assert parse_completion({"model": "m", "prompt": [[1, 2, 3]]}).prompt == (1, 2, 3)
    assert parse_completion({"model": "m", "prompt": ["text"]}).prompt == "text"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None), ({"messages": CHAT["messages"]}, "model"), ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "top_p": 1.5}, "top_p"), ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "max_tokens": True}, "max_tokens"), ({**CHAT, "stop": ["a"] * 5}, "stop"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
        ({**CHAT, "logprobs": True}, "logprobs"), ({**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_parse_chat_refuses(body: Any, param: str | None) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat(body)
    assert caught.value.status == 400 and caught.value.param == param


@pytest.mark.parametrize("prompt", ["", [], [["a"]], ["a", "b"], [1, True], None])
def test_parse_completion_refuses(prompt: Any) -> None:
    with pytest.raises(ApiError, match="prompt"):
        parse_completion({"model": "m", "prompt": prompt})


def test_swarm_failures_map_to_status_codes() -> None:
    def wrapped(inner: BaseException) -> SwarmError:
        try:
            raise SwarmError("layers 0:2 failed 5 times") from inner
        except SwarmError as e:
            return e

    busy = from_generation_error(wrapped(RemoteError("busy", "KV cache full", True, "peerA")))
    assert busy.status == 429 and busy.headers()["Retry-After"] and "KV cache full" in busy.message
    assert from_generation_error(RemoteError("rate_limited", "slow down", True)).status == 429
    assert from_generation_error(RemoteError("too_long", "max_length 9000 exceeds 8192", False)).status == 400
    gone = from_generation_error(wrapped(NoRouteError("m", [1])))
    assert gone.status == 503 and gone.code == "no_route" and "--layers 1:2" in gone.message
    assert from_generation_error(SwarmError("retries exhausted")).status == 503
    assert from_generation_error(ValueError("prompt is empty")).status == 400
    assert from_generation_error(RuntimeError("bug")).status == 500
