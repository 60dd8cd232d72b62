"""Drafters for speculative decoding: cheap guesses of the next tokens, made on the client.

A drafter proposes up to `k` tokens that might follow the text so far; the swarm then checks
them all in one step (see `client/speculative.py`). Two kinds:

- `PromptLookupDrafter`: finds the latest earlier occurrence of the text's last n-gram and
  proposes what followed it. No model, near-zero cost; shines when the answer copies from the
  prompt (summaries, edits, code), proposes nothing on fresh text.
- `ModelDrafter`: a small local causal LM with the same tokenizer, with its own KV cache that
  follows the accepted text (cropped back when drafts are rejected).

`AdaptiveK` picks how many tokens to propose: more after full acceptance, fewer after a miss,
so wasted verify work stays small on text the drafter cannot predict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch


@dataclass
class Draft:
    """Proposed tokens; `probs[i]` is the drafter's distribution q (V,) that `tokens[i]` was drawn
    from, or None for a deterministic proposal (q is a point mass on the token)."""

    tokens: list[int]
    probs: list[torch.Tensor] | None = None


class Drafter(Protocol):
    def propose(self, tokens: list[int], k: int) -> Draft:
        """Up to `k` tokens that may follow `tokens` (the whole text so far, prompt included)."""
        ...


class PromptLookupDrafter:
    """n-gram match against the prompt and the text so far (prompt lookup decoding)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        # min_ngram=2 by default: a single-token match ("the", ",") is right too rarely on open
        # text, and every wrong guess costs the peers a verify row.
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, tokens: list[int], k: int) -> Draft:
        if k <= 0:
            return Draft([])
        n_tokens = len(tokens)
        for n in range(min(self.max_ngram, n_tokens - 1), self.min_ngram - 1, -1):
            tail = tokens[n_tokens - n :]
            # Latest match first: recent text predicts the next words best (and follows loops).
            for start in range(n_tokens - n - 1, -1, -1):
                if tokens[start : start + n] == tail:
                    follow = tokens[start + n : start + n + k]
                    if follow:
                        return Draft(follow)
        return Draft([])


ScoreFn = Callable[[torch.Tensor, list[int], int], torch.Tensor]


class ModelDrafter:
    """A small local transformers causal LM that shares the target's tokenizer.

    The drafter keeps a KV cache of `self.cached` tokens; each `propose` keeps the longest common
    prefix with the new text (`DynamicCache.crop`), feeds the rest, then drafts token by token.
    With `sample=True` (set per call by the speculative loop) drafts are sampled from the
    drafter's processed distribution and their q's are returned for the acceptance rule.
    """

    def __init__(
        self, path: str | Path, vocab_size: int | None = None, dtype: torch.dtype = torch.float32
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"draft model {self.path} is not a local checkpoint folder")
        self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype).eval()
        self.vocab_size = vocab_size or self.model.config.vocab_size  # the target's vocabulary
        self.cache = None
        self.cached: list[int] = []  # tokens whose KV the cache holds
        self.scores: ScoreFn | None = None  # (logits (V,), context, generated) -> processed scores
        self.generator: torch.Generator | None = None
        self.sample = False
        self.generated = 0  # tokens generated before this proposal (for min_new_tokens)

    def reset(self) -> None:
        self.cache, self.cached = None, []

    @torch.inference_mode()
    def _feed(self, tokens: list[int]) -> torch.Tensor:
        """Run `tokens` after the cached ones; logits (V,) after the last one."""
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache()
        ids = torch.tensor([tokens], dtype=torch.long)
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True)  # fills self.cache in place
        self.cached.extend(tokens)
        logits = out.logits[0, -1].float()
        # Match the target's vocabulary: drop padding rows, or forbid ids the drafter lacks.
        if logits.shape[0] > self.vocab_size:
            logits = logits[: self.vocab_size]
        elif logits.shape[0] < self.vocab_size:
            logits = torch.cat([logits, torch.full((self.vocab_size - logits.shape[0],), -float("inf"))])
        return logits

    def propose(self, tokens: list[int], k: int) -> Draft:
        if k <= 0 or not tokens:
            return Draft([])
        common = 0
        for a, b in zip(self.cached, tokens):
            if a != b:
                break
            common += 1
        common = min(common, len(tokens) - 1)  # feed at least one token to get fresh logits
        if self.cache is not None and common < len(self.cached):
            self.cache.crop(common - len(self.cached))  # a negative count: drop that many from the end
            del self.cached[common:]
        logits = self._feed(tokens[common:])
        context = list(tokens)
        drafted: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            scores = self.scores(logits, context, self.generated + i) if self.scores else logits[None]
            if self.sample:
                q = torch.softmax(scores[0], dim=-1)
                token = int(torch.multinomial(q, 1, generator=self.generator))
                probs.append(q)
            else:
                token = int(scores[0].argmax())
            drafted.append(token)
            context.append(token)
            if i < k - 1:
                logits = self._feed([token])
        return Draft(drafted, probs if self.sample else None)


class AdaptiveK:
    """How many tokens to draft, and whether sending a draft is worth it at all.

    k: +2 after a fully accepted draft, -1 after a rejection. Growing fast pays off on copied
    spans (many tokens per round trip); shrinking slowly to 1 keeps a wrong guess cheap without
    giving up after one miss.

    The gate: an accepted first draft token saves a whole single-token step; any draft makes
    the step a multi-token one (measured slower on the peers: 2 rows cost ~1.4x one row on a
    loaded CPU), and a rejected one adds a `truncate` round trip. So a draft is sent only while
        P(hit) * t_single > (t_multi - t_single) + (1 - P(hit)) * t_truncate,
    with the times measured (moving averages) and P(hit) a moving average over recent drafts. Drafts that were not sent still
    update P (was the first drafted token the one the model produced?), so the gate reopens as
    soon as the drafter starts guessing right, without paying for exploration.
    A fixed `k` (adaptive=False) never changes and always sends.
    """

    def __init__(self, initial: int = 4, minimum: int = 1, maximum: int = 16, adaptive: bool = True) -> None:
        if not 1 <= minimum <= initial <= maximum:
            raise ValueError(f"need 1 <= minimum <= initial <= maximum, got {minimum}, {initial}, {maximum}")
        self.k, self.minimum, self.maximum, self.adaptive = initial, minimum, maximum, adaptive
        self.hit_rate = 0.5  # P(first drafted token accepted); optimistic start: try drafting
        self.times: dict[str, float] = {}  # "single", "multi", "truncate": seconds, moving averages

    def update(self, proposed: int, accepted: int) -> None:
        if not self.adaptive or proposed == 0:
            return  # no proposal says nothing about how good proposals are
        if accepted == proposed:
            self.k = min(self.maximum, self.k + 2)
        else:
            self.k = max(self.minimum, self.k - 1)

    def observe(self, first_token_hit: bool) -> None:
        self.hit_rate += 0.25 * (float(first_token_hit) - self.hit_rate)

    def record_time(self, kind: str, seconds: float) -> None:
        """kind: "single" (decode step of one token), "multi" (a verify step) or "truncate"."""
        old = self.times.get(kind)
        self.times[kind] = seconds if old is None else old + 0.25 * (seconds - old)

    def worth_sending(self) -> bool:
        if not self.adaptive or len(self.times) < 3:
            return True  # until every cost is measured, try (the measurements need drafts sent)
        t1, tm, tt = self.times["single"], self.times["multi"], self.times["truncate"]
        return self.hit_rate * t1 > max(0.0, tm - t1) + (1 - self.hit_rate) * tt
