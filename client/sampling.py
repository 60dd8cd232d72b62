"""Choosing the next token, with transformers' own logits processors so semantics match `generate`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()

    def validate(self) -> None:
        """Raise ValueError naming the bad parameter, before any network traffic."""
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")


class TokenChooser:
    """Applies the processors in transformers' order: penalties, then temperature, top-k, top-p."""

    def __init__(self, params: SamplingParams, generator: torch.Generator | None = None) -> None:
        params.validate()
        self.params = params
        self.generator = generator
        self.processors = LogitsProcessorList()
        if params.repetition_penalty != 1.0:
            self.processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
        self.warpers = LogitsProcessorList()
        if params.do_sample:
            if params.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                self.warpers.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(params.top_p))

    def choose(self, logits: torch.Tensor, token_ids: list[list[int]], generated: int) -> list[int]:
        """logits (B, V) for the last position of each sequence; token_ids: each sequence so far."""
        masking_eos = generated < self.params.min_new_tokens and self.params.eos_token_ids
        if not self.params.do_sample and not self.processors and not masking_eos:
            # Plain greedy needs no history: one argmax over the batch and one device sync, instead
            # of copying every sequence's ids to the head's device for processors that do nothing.
            return logits.argmax(dim=-1).tolist()
        chosen = []
        for b, row in enumerate(logits):
            scores = row[None, :].float()  # (1, V), on the head's device
            ids = torch.tensor([token_ids[b]], dtype=torch.long, device=row.device)  # (1, T_b): ragged
            scores = self.processors(ids, scores)
            if masking_eos:
                eos = torch.tensor(self.params.eos_token_ids, dtype=torch.long, device=row.device)
                scores = scores.index_fill(1, eos, -float("inf"))  # out of place: logits may be inference tensors
            if self.params.do_sample:
                probs = torch.softmax(self.warpers(ids, scores), dim=-1)
                if self.generator is not None:  # a seeded generator draws on its own device
                    probs = probs.to(self.generator.device)
                chosen.append(int(torch.multinomial(probs[0], 1, generator=self.generator)))
            else:
                chosen.append(int(scores[0].argmax()))
        return chosen
