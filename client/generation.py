"""The token-by-token generation loop over an `InferenceSession`."""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

import torch

from client.drafting import AdaptiveK
from client.sampling import TokenChooser
from client.session import InferenceSession
from client.speculative import GenerationStats, make_drafter, run_speculative

if TYPE_CHECKING:
    from client.model import DistributedModel


class StopStrings:
    """Ends a sequence once its generated text (special tokens skipped) contains one of `strings`.

    Only a tail of the tokens is decoded per step: a newly completed string lies in it, since a
    character takes at most 4 byte-level tokens (+ a few skipped special tokens).
    """

    def __init__(self, tokenizer: Any, strings: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.strings = strings
        self.window = 4 * max(len(s) for s in strings) + 8

    @classmethod
    def parse(cls, tokenizer: Any, stop: str | list[str] | tuple[str, ...] | None) -> StopStrings | None:
        """`generate(stop=...)`'s argument, checked before any network traffic."""
        if stop is None:
            return None
        strings = (stop,) if isinstance(stop, str) else tuple(stop)
        if not strings:
            return None
        if not all(isinstance(s, str) and s for s in strings):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {stop!r}")
        if tokenizer is None:
            raise ValueError("stop strings need the checkpoint's tokenizer; this folder has none")
        return cls(tokenizer, strings)

    def hit(self, generated: list[int]) -> bool:
        text = self.tokenizer.decode(generated[-self.window :], skip_special_tokens=True)
        return any(s in text for s in self.strings)



def strip_left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """(B, T) ids (+ mask) -> each sequence's real tokens (left padding removed)."""
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if attention_mask is None:
        return [row.tolist() for row in input_ids]
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids {tuple(input_ids.shape)}")
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]

def last_logits(model: DistributedModel, session: InferenceSession, feed: list[list[int]]) -> torch.Tensor:
    """Send each sequence's new tokens through the swarm; logits (B, V) at each sequence's last token."""
    new_tokens = [len(f) for f in feed]
    ids = torch.tensor([t for f in feed for t in f], dtype=torch.long)  # (N,)
    hidden = session.step(model.head.embed(ids), new_tokens, token_ids=feed)  # (N, H); ids let peers share prefixes
    if len(new_tokens) != hidden.shape[0]:  # a prefill: keep each sequence's last row (a decode has only those)
        hidden = hidden[[end - 1 for end in itertools.accumulate(new_tokens)]]
    return model.head.logits(hidden).float()  # (B, V)


def run_generation(
    model: DistributedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    chooser: TokenChooser,
    *,
    max_new_tokens: int,
    pad_token_id: int,
    streamer: Any,
    session: InferenceSession | None,
    speculative: Any = None,
    num_draft_tokens: int | None = None,
    stop: str | list[str] | None = None,
) -> torch.Tensor:
    started = time.perf_counter()
    prompts = strip_left_padding(input_ids, attention_mask)
    batch = len(prompts)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    stopper = StopStrings.parse(model.tokenizer, stop)
    drafter, label = None, None
    if speculative is not None:
        if stopper is not None:
            raise ValueError("stop strings are not supported with speculative decoding")
        if batch > 1:
            raise ValueError(f"speculative decoding supports a batch of one sequence, got {batch}")
        if num_draft_tokens is not None and num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        drafter, label = make_drafter(model, speculative, chooser)
        # A fixed num_draft_tokens is used as given; None: adaptive k starting at 4.
        k_control = AdaptiveK(num_draft_tokens, num_draft_tokens, num_draft_tokens, adaptive=False) \
            if num_draft_tokens else AdaptiveK()
    stats = GenerationStats(speculative=label)
    if streamer is not None and batch > 1:
        raise ValueError("a streamer can only follow one sequence; pass a batch of one")
    own_session = session is None
    if own_session:
        if any(not p for p in prompts):
            raise ValueError("the prompt is empty: give at least one token")
        session = model.inference_session(max(len(p) for p in prompts) + max_new_tokens, batch)
    elif session.batch != batch:
        raise ValueError(f"the session holds {session.batch} sequences but input_ids has {batch}")
    feed = [pending + prompt for pending, prompt in zip(session.pending, prompts)]
    if any(not f for f in feed):
        raise ValueError("the prompt is empty: give at least one token")
    needed = max(done + len(f) + max_new_tokens for done, f in zip(session.lengths, feed))
    if needed > session.max_length + 1:  # the last sampled token is not sent through the swarm
        raise ValueError(
            f"prompt and max_new_tokens need {needed - 1} tokens but the session's max_length is "
            f"{session.max_length}; open a session with a larger max_length or shorten the prompt"
        )
    generated: list[list[int]] = [[] for _ in range(batch)]
    steps_before = session.stats.steps
    try:
        if streamer is not None:
            streamer.put(input_ids[:1].cpu())
        for seq, prompt in zip(session.token_ids, prompts):
            seq.extend(prompt)
        finished = [False] * batch
        if drafter is not None and max_new_tokens > 0:
            generated[0] = run_speculative(model, session, feed[0], chooser, drafter, k_control,
                                           max_new_tokens=max_new_tokens, streamer=streamer, stats=stats)
            max_new_tokens, feed = 0, session.pending  # done: the token-by-token loop below is skipped
        logits = last_logits(model, session, feed) if max_new_tokens > 0 else None
        for step in range(max_new_tokens):
            chosen = chooser.choose(logits, session.token_ids, step)
            chosen = [pad_token_id if done else t for t, done in zip(chosen, finished)]
            for b, token in enumerate(chosen):
                generated[b].append(token)
                session.token_ids[b].append(token)
                finished[b] = finished[b] or token in chooser.params.eos_token_ids \
                    or (stopper is not None and stopper.hit(generated[b]))
            if streamer is not None:
                streamer.put(torch.tensor(chosen[:1]))
            if all(finished) or step == max_new_tokens - 1:
                session.pending = [[t] for t in chosen]  # not yet through the swarm
                break
            logits = last_logits(model, session, [[t] for t in chosen])
        else:  # max_new_tokens == 0: nothing was sent, the whole feed is still to go
            session.pending = feed
    finally:
        if streamer is not None:
            streamer.end()
        model.last_session = session
        if own_session:
            session.close()
        stats.steps = session.stats.steps - steps_before
        stats.new_tokens = max(len(g) for g in generated)
        stats.wall_time = time.perf_counter() - started
        model.last_stats = stats
    new = torch.tensor(generated, dtype=input_ids.dtype).reshape(batch, -1)
    return torch.cat([input_ids, new], dim=1)
