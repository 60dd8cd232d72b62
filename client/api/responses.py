"""OpenAI response objects: whole answers and stream chunks of both endpoints.

`Reply` knows which endpoint it answers (`chat.completion` or `text_completion`) and builds the
JSON dicts at the HTTP boundary; nothing else in the package deals with their shape.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from client.api.engine import Finished


def usage(done: Finished) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


@dataclass
class Reply:
    model: str
    chat: bool
    include_usage: bool = False
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    def _head(self, obj: str) -> dict[str, Any]:
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        return {"id": prefix + self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, done: Finished) -> dict[str, Any]:
        """The non-streaming answer."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": done.reason}
            return {**self._head("chat.completion"), "choices": [choice], "usage": usage(done)}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": done.reason}
        return {**self._head("text_completion"), "choices": [choice], "usage": usage(done)}

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> dict[str, Any]:
        """One stream chunk: a text delta, or (text None) the final chunk carrying finish_reason."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if first else \
                ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            out = {**self._head("text_completion"), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None  # OpenAI: null on every chunk but the last
        return out

    def usage_chunk(self, done: Finished) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(done)}
