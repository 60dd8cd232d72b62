"""Request bodies of `/v1/chat/completions` and `/v1/completions`, parsed into frozen dataclasses.

Parsing is strict where a wrong value would silently change the answer (types, ranges, `n`,
penalties we cannot honour) and lenient where OpenAI clients send bookkeeping fields we can
ignore (`user`, `metadata`, ...). Every refusal is an `ApiError` 400 naming the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from client.api.errors import bad_request

MAX_STOP = 4  # OpenAI's own limit on stop strings
MAX_STOP_CHARS = 256
MAX_MESSAGES = 4096
ROLES = ("system", "developer", "user", "assistant")
# Fields OpenAI clients send that do not change what we generate: accepted and ignored.
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls", "stream_options",
                     "logprobs", "top_logprobs", "logit_bias", "response_format", "echo", "suffix", "best_of"})
COMMON = frozenset({"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "n",
                    "presence_penalty", "frequency_penalty", "repetition_penalty"})


@dataclass(frozen=True)
class Sampling:
    """What every generation request carries besides its prompt."""

    model: str
    max_tokens: int | None  # None: up to the context limit
    temperature: float | None  # None: the checkpoint's generation_config (greedy without one)
    top_p: float | None
    top_k: int  # an extension (vLLM has it too); 0: off, as in OpenAI
    seed: int | None
    stop: tuple[str, ...]
    repetition_penalty: float | None  # an extension; presence/frequency penalties do not map onto it
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class ChatRequest:
    sampling: Sampling
    messages: tuple[ChatMessage, ...]


@dataclass(frozen=True)
class CompletionRequest:
    sampling: Sampling
    prompt: str | tuple[int, ...]


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"{key} must be a number, got {type(value).__name__}", key, "invalid_type")
    if not low <= value <= high:
        raise bad_request(f"{key} must be between {low:g} and {high:g}, got {value}", key, "invalid_value")
    return float(value)


def _integer(body: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{key} must be an integer, got {type(value).__name__}", key, "invalid_type")
    if not low <= value <= high:
        raise bad_request(f"{key} must be between {low} and {high}, got {value}", key, "invalid_value")
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"{key} must be true or false, got {type(value).__name__}", key, "invalid_type")
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise bad_request("stop must be a string or a list of strings", "stop", "invalid_type")
    if len(strings) > MAX_STOP or any(not s or len(s) > MAX_STOP_CHARS for s in strings):
        raise bad_request(f"stop takes at most {MAX_STOP} non-empty strings of at most {MAX_STOP_CHARS} characters",
                          "stop", "invalid_value")
    return tuple(strings)


def _unsupported(body: dict[str, Any]) -> None:
    """Options that would change the answer in ways we cannot honour: refused, not ignored."""
    if body.get("n") not in (None, 1):
        raise bad_request("only n=1 is supported; send several requests for several answers", "n", "invalid_value")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise bad_request(f"{key} is not supported (only 0); repetition_penalty (> 1 discourages repeats) is",
                              key, "unsupported_parameter")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") not in (None, 0):
        raise bad_request("logprobs are not supported", "logprobs", "unsupported_parameter")
    if body.get("logit_bias") not in (None, {}):
        raise bad_request("logit_bias is not supported", "logit_bias", "unsupported_parameter")
    if body.get("echo") not in (None, False) or body.get("suffix") not in (None, ""):
        raise bad_request("echo and suffix are not supported", "echo", "unsupported_parameter")
    if body.get("best_of") not in (None, 1):
        raise bad_request("only best_of=1 is supported", "best_of", "unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise bad_request("only response_format {\"type\": \"text\"} is supported", "response_format",
                          "unsupported_parameter")


def _check_keys(body: dict[str, Any], own: frozenset[str]) -> None:
    unknown = sorted(set(body) - COMMON - IGNORED - own)
    if unknown:
        raise bad_request(f"unrecognized request argument: {unknown[0]}", unknown[0], "unknown_parameter")


def parse_sampling(body: dict[str, Any], max_tokens_key: str = "max_tokens") -> Sampling:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required: a name from GET /v1/models", "model", "invalid_type")
    _unsupported(body)
    max_tokens = _integer(body, max_tokens_key, 1, 1 << 30)
    if max_tokens is None and max_tokens_key != "max_tokens":
        max_tokens = _integer(body, "max_tokens", 1, 1 << 30)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options", "invalid_type")
    stream = _flag(body, "stream")
    include_usage = _flag(options or {}, "include_usage")
    if include_usage and not stream:
        raise bad_request("stream_options is only allowed with stream: true", "stream_options", "invalid_value")
    seed = _integer(body, "seed", -(1 << 63), (1 << 63) - 1)
    return Sampling(
        model=model, max_tokens=max_tokens, temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0), top_k=_integer(body, "top_k", 0, 1 << 20) or 0,
        seed=seed, stop=_stop(body), repetition_penalty=_number(body, "repetition_penalty", 0.01, 10.0),
        stream=stream, include_usage=include_usage,
    )


def _content(value: Any, index: int) -> str:
    """A message's content: a string or a list of text parts (images and audio are refused)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{index}].content: only text parts are supported",
                                  f"messages[{index}].content", "invalid_value")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"messages[{index}].content must be a string or a list of text parts",
                      f"messages[{index}].content", "invalid_type")


def parse_chat(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    _check_keys(body, frozenset({"messages", "max_completion_tokens"}))
    sampling = parse_sampling(body, "max_completion_tokens")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages must be a non-empty list of {role, content} objects", "messages", "invalid_type")
    if len(raw) > MAX_MESSAGES:
        raise bad_request(f"at most {MAX_MESSAGES} messages", "messages", "invalid_value")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role",
                              "invalid_value")
        messages.append(ChatMessage(message["role"], _content(message.get("content"), i)))
    return ChatRequest(sampling, tuple(messages))


def parse_completion(body: Any) -> CompletionRequest:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    _check_keys(body, frozenset({"prompt"}))
    sampling = parse_sampling(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str) and prompt:
        return CompletionRequest(sampling, prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return CompletionRequest(sampling, tuple(prompt))
    raise bad_request("prompt must be a non-empty string or list of token ids (one prompt per request)",
                      "prompt", "invalid_value")
