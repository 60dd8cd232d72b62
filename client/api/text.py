"""Token ids -> text deltas for streaming: incremental detokenization and stop-string hold-back.

`Detokenizer` decodes a sliding window of ids (the scheme of TGI and vLLM): a token whose bytes
end mid-character decodes to U+FFFD, so its text waits for the token that completes it, and
leading-space rules see the tokens before. Special tokens are skipped, so they never reach text.

`StopScanner` cuts the text at the first stop string and holds back a tail that could still
become one, so no part of a stop string is ever sent.
"""

from __future__ import annotations

from typing import Any

CONTEXT_TOKENS = 5  # prompt tokens decoded with the first new ones (leading-space rules need them)


class Detokenizer:
    def __init__(self, tokenizer: Any, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix = 0  # ids[prefix:read] is what the last emitted text was decoded with
        self.read = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, new_ids: list[int]) -> str:
        """The new text that `new_ids` complete ('' while a character is unfinished)."""
        self.ids.extend(new_ids)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is left at the end (an unfinished character comes out as U+FFFD)."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""


class StopScanner:
    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = stop
        self.text = ""
        self.sent = 0  # text[:sent] went to the client
        self.stopped = False

    def _held(self) -> int:
        """Length of the longest tail of the unsent text that starts some stop string."""
        tail = self.text[self.sent :]
        for n in range(min(len(tail), max((len(s) for s in self.stop), default=1) - 1), 0, -1):
            if any(s.startswith(tail[-n:]) for s in self.stop):
                return n
        return 0

    def feed(self, delta: str) -> str:
        """Text that can be sent now; sets `stopped` once a stop string appeared (it is cut off)."""
        if self.stopped:
            return ""
        self.text += delta
        # A match cannot start before `sent`: any prefix of it would have been held back.
        hits = [i for i in (self.text.find(s, self.sent) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            end = min(hits)
        else:
            end = len(self.text) - self._held()
        out, self.sent = self.text[self.sent : end], end
        return out

    def flush(self) -> str:
        """At the end of generation: the held-back tail was not a stop string after all."""
        if self.stopped:
            return ""
        out, self.sent = self.text[self.sent :], len(self.text)
        return out
