"""Speculative decoding through the swarm: draft on the client, verify k+1 tokens per swarm step.

One verify step sends the pending token plus k drafted tokens through the route; the peers
return hidden states for all k+1 positions, so the client gets the model's distribution after
each prefix and accepts the longest prefix the model agrees with, plus one token of its own
(the correction at the first rejection, or a bonus token after a fully accepted draft). The KV
entries of rejected drafts are dropped on every hop with `InferenceSession.truncate`.

Acceptance rules (output identical in distribution to plain decoding):
- greedy: a draft token is accepted iff it is the argmax; the output equals plain greedy.
- sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft x ~ q with probability
  min(1, p(x)/q(x)); on rejection draw from norm(max(0, p - q)). For prompt lookup q is a
  point mass on x, which makes that "accept with p(x), else draw from p without x".
p is the model's distribution after the same processors/warpers plain `generate` applies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from client.drafting import AdaptiveK, Draft, Drafter, ModelDrafter, PromptLookupDrafter
from client.sampling import TokenChooser
from client.session import InferenceSession

if TYPE_CHECKING:
    from client.model import DistributedModel

PROMPT_LOOKUP = "prompt_lookup"


@dataclass
class GenerationStats:
    """What the last `generate` did; `model.last_stats` (set for plain generation too)."""

    new_tokens: int = 0  # tokens produced (per sequence for batch 1; longest sequence otherwise)
    steps: int = 0  # swarm steps (each a round trip through the whole route), prefill included
    drafted: int = 0  # draft tokens proposed and sent for verification
    accepted: int = 0  # draft tokens the model agreed with
    wall_time: float = 0.0  # seconds for the whole call
    speculative: str | None = None  # "prompt_lookup", a draft model path, or None (plain)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def target_scores(
    chooser: TokenChooser, logits: torch.Tensor, context: list[int], generated: int
) -> torch.Tensor:
    """Processed scores (1, V) for one position, exactly as `TokenChooser.choose` computes them."""
    params = chooser.params
    ids = torch.tensor([context], dtype=torch.long, device=logits.device)  # (1, T)
    scores = chooser.processors(ids, logits[None, :].float())
    if generated < params.min_new_tokens and params.eos_token_ids:
        eos = torch.tensor(params.eos_token_ids, dtype=torch.long, device=logits.device)
        scores = scores.index_fill(1, eos, -float("inf"))
    if params.do_sample:
        scores = chooser.warpers(ids, scores)
    return scores


def verify(
    chooser: TokenChooser, logits: torch.Tensor, draft: Draft, context: list[int], generated: int
) -> tuple[list[int], int]:
    """logits (m+1, V) after the pending token and each of the m drafts -> (tokens to emit, drafts accepted).

    All emitted tokens but the last are accepted drafts; the last is the correction, the bonus
    token, or an accepted draft that ended the text (EOS).
    """
    params, gen = chooser.params, chooser.generator
    d = draft.tokens
    out: list[int] = []
    for i in range(len(d) + 1):
        scores = target_scores(chooser, logits[i], context + out, generated + i)[0]  # (V,)
        if not params.do_sample:
            target = int(scores.argmax())
            out.append(target)
            if i == len(d) or d[i] != target:
                return out, i
            if target in params.eos_token_ids:
                return out, i + 1
            continue
        p = torch.softmax(scores.cpu(), dim=-1)  # beside the draft's probabilities and the generator
        if i == len(d):  # every draft accepted: the bonus token comes straight from p
            out.append(int(torch.multinomial(p, 1, generator=gen)))
            return out, i
        x = d[i]
        q = draft.probs[i] if draft.probs is not None else None
        q_x = float(q[x]) if q is not None else 1.0
        u = float(torch.rand((), generator=gen))
        if u * q_x < float(p[x]):  # accept with probability min(1, p(x)/q(x))
            out.append(x)
            if x in params.eos_token_ids:
                return out, i + 1
            continue
        if q is not None:
            residual = torch.clamp(p - q, min=0)
        else:  # point mass: max(0, p - onehot(x)) is p with x removed
            residual = p.clone()
            residual[x] = 0
        if float(residual.sum()) <= 0:  # only reachable through rounding; p itself is still exact-ish
            residual = p
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=gen)))
        return out, i  # the residual has no mass on x, so the correction differs from the draft
    raise AssertionError("unreachable")


def make_drafter(model: DistributedModel, speculative: Any, chooser: TokenChooser) -> tuple[Drafter, str]:
    """`"prompt_lookup"`, a draft checkpoint folder, or any object with `propose(tokens, k)`."""
    if isinstance(speculative, str) and speculative == PROMPT_LOOKUP:
        return PromptLookupDrafter(), PROMPT_LOOKUP
    if isinstance(speculative, (str, Path)):
        path = Path(speculative)
        cache: dict[Path, ModelDrafter] = model.__dict__.setdefault("_draft_models", {})
        if path not in cache:  # loading a checkpoint is slow; keep it for the next generate
            cache[path] = ModelDrafter(path, vocab_size=model.model_config.vocab_size)
        drafter = cache[path]
        drafter.scores = lambda logits, ctx, g: target_scores(chooser, logits, ctx, g)
        drafter.sample = chooser.params.do_sample
        drafter.generator = chooser.generator
        return drafter, str(path)
    if hasattr(speculative, "propose"):
        return speculative, type(speculative).__name__
    raise ValueError(
        f"speculative must be {PROMPT_LOOKUP!r}, a draft model folder or a drafter, got {speculative!r}"
    )


def run_speculative(
    model: DistributedModel,
    session: InferenceSession,
    feed: list[int],
    chooser: TokenChooser,
    drafter: Drafter,
    k_control: AdaptiveK,
    *,
    max_new_tokens: int,
    streamer: Any,
    stats: GenerationStats,
) -> list[int]:
    """Generate up to `max_new_tokens` for the session's one sequence; `feed` is its unsent text.

    `session.token_ids[0]` already holds the whole text (prompt included); on return the last
    generated token is `session.pending`, as after plain generation, so sessions can continue.
    """
    tokens = session.token_ids[0]
    eos = chooser.params.eos_token_ids
    generated: list[int] = []
    while len(generated) < max_new_tokens:
        # k + 1 tokens come back at most; never draft past max_new_tokens (and the session's room).
        k = min(k_control.k, max_new_tokens - len(generated) - 1)
        if isinstance(drafter, ModelDrafter):
            drafter.generated = len(generated)
        proposal = drafter.propose(tokens, k) if k > 0 else Draft([])
        send = bool(proposal.tokens) and k_control.worth_sending()
        draft = Draft(proposal.tokens[:k], proposal.probs[:k] if proposal.probs is not None else None)
        if not send:
            draft = Draft([])
        ids = feed + draft.tokens
        started = time.perf_counter()
        hidden = session.step(model.head.embed(torch.tensor(ids, dtype=torch.long)), [len(ids)], token_ids=[ids])  # (n, H)
        if len(feed) == 1:  # a decode step; a prefill's time says nothing about the next steps
            k_control.record_time("multi" if draft.tokens else "single", time.perf_counter() - started)
        logits = model.head.logits(hidden[len(feed) - 1 :]).float()  # (k+1, V): after pending, each draft
        new, accepted = verify(chooser, logits, draft, tokens, len(generated))
        # The peers hold everything fed; keep only what was emitted except the last token,
        # which stays pending (exactly the state plain generation leaves behind).
        keep = session.lengths[0] - len(ids) + len(feed) + len(new) - 1
        if keep < session.lengths[0]:
            started = time.perf_counter()
            session.truncate(keep)
            k_control.record_time("truncate", time.perf_counter() - started)
        if proposal.tokens:  # a draft held back still tells whether drafting would have paid
            k_control.observe(accepted > 0 if send else proposal.tokens[0] == new[0])
        stats.drafted += len(draft.tokens)
        stats.accepted += accepted
        k_control.update(len(draft.tokens), accepted)
        for token in new:
            generated.append(token)
            tokens.append(token)
            if streamer is not None:
                streamer.put(torch.tensor([token]))
        feed = [new[-1]]
        if new[-1] in eos:
            break
    session.pending = [feed]
    return generated
