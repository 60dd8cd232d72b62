"""Checking untrusted peers: recompute a hop's output on other peers and compare; weed out odd weights.

A verified step sends the hop's whole input so far (its recorded history plus this step) as a
stateless `forward` through other peers serving the same layers, and compares the rows of this
step. When they disagree, a third opinion from yet other peers decides: a peer whose output
disagrees with two others is the liar. Without a decision (no third opinion, or three different
answers) the step is *inconclusive*, and an inconclusive step is a failure: the session does not
use the disputed output, it fails the hop over and recomputes the step elsewhere.

How two results are compared (`agree`): row by row, each row against its own scale
(`|a_r - b_r| <= tol * max(|a_r|, |b_r|)`, L2 norms). A whole-step scale would let one large row
(the first token's activations are often 20x the others) hide a lie in every other row.

Which peers give an opinion, and `tol`: like for like. Opinions come from peers announcing the
same quantization (different weights legitimately give different results) and, when any exist,
the same dtype as the checked hop; `tol` is then that dtype's, which is the stricter dtype of the
two peers, since they are equal. So the checked peer's announcement does not loosen anything: its
verifiers really compute in that dtype. Only when no peer of that dtype serves the layers are
other dtypes asked, and then the tolerance must be that of the less precise computation (`tolerance`
with `mixed=True`): a stricter one would condemn every honest half-precision peer checked by
float32 peers. Measured honest differences (stateless pass vs cached decode, SmolLM2-135M, 30
layers, relative per row): float32 1.3e-6, float16 2.7e-3, bfloat16 1.6e-2.

Fingerprints (`fingerprint_outliers`): a peer's announced fingerprint hashes the weights of its
exact layer range, so only peers announcing the *same* range can be compared. Among those, a
fingerprint held by a strict majority is taken as the model's; peers announcing another one are
never routed to. A tie (say one honest peer and one impostor) decides nothing: verification is
the backstop there. A client could also hash its own copy of the weights, but clients usually
hold only the embeddings and head, so the majority rule is what every client can apply.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from client.errors import SwarmError
from client.forward import forward_through_swarm
from client.hop import HopSession
from routing import NoRouteError
from swarm.types import SwarmView

if TYPE_CHECKING:
    from client.swarm_client import SwarmClient

logger = logging.getLogger(__name__)

# Relative tolerance per row (L2 norms) by the dtype peers compute in: about 100x (float32) and
# 3-8x (half precision) the honest differences measured above, far below a lie that changes tokens.
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}


def tolerance(*dtypes: str, mixed: bool = False) -> float:
    """The tolerance for peers computing in these dtypes (an unknown dtype counts as float32).

    The stricter one when they agree; with `mixed=True` (peers of different dtypes compared) the
    looser one, which bounds the honest difference between them.
    """
    tols = [TOLERANCE.get(d, TOLERANCE["float32"]) for d in dtypes]
    return max(tols) if mixed else min(tols)


def row_errors(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row: |a_r - b_r| / max(|a_r|, |b_r|) (L2), with a tiny floor for all-zero rows. (N,)"""
    a, b = a.float(), b.float()
    scale = torch.maximum(a.norm(dim=-1), b.norm(dim=-1)).clamp_min(1e-6)
    return (a - b).norm(dim=-1) / scale


def agree(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return a.shape == b.shape and bool((row_errors(a, b) <= tol).all())


@dataclass(frozen=True)
class Verdict:
    """What a verification decided: whether the hop's output may be used, and who lied (if known)."""

    use: bool
    liar: str | None = None
    inconclusive: bool = False


def _step_rows(full: torch.Tensor, lengths: list[int], new_tokens: list[int]) -> torch.Tensor:
    """The rows of the current step inside a full-history output (each sequence's last n rows)."""
    parts = [seq[-n:] for seq, n in zip(torch.split(full, lengths), new_tokens)]
    return torch.cat(parts)


async def _opinion(
    swarm: SwarmClient, full: torch.Tensor, lengths: list[int], new_tokens: list[int], hop: HopSession,
    exclude: set[str], used: list[str],
) -> torch.Tensor | None:
    """This step's rows recomputed by peers not in `exclude` (their ids go to `used`), or None."""
    try:
        out = await forward_through_swarm(swarm, full, lengths, hop.layers.start, hop.layers.end,
                                          exclude=exclude, used=used)
    except (NoRouteError, SwarmError) as e:
        logger.info("no opinion on layers %s besides %s: %s", hop.layers, sorted(exclude), e)
        return None
    if out.shape != full.shape or not torch.isfinite(out).all():
        logger.warning("peers %s returned a malformed forward result %s; ignoring it", used, tuple(out.shape))
        for peer_id in used:
            swarm.ban(peer_id)
        return None
    return _step_rows(out, lengths, new_tokens)


async def check_step(
    swarm: SwarmClient, hop: HopSession, x: torch.Tensor, new_tokens: list[int], y: torch.Tensor,
    exclude: set[str] = frozenset(),
) -> Verdict:
    """Recompute this step of `hop` elsewhere and judge its output `y` (peers in `exclude` never asked)."""
    per_seq = [torch.cat([*chunks, rows]) for chunks, rows in zip(hop.history, torch.split(x, new_tokens))]
    full, lengths = torch.cat(per_seq), [t.shape[0] for t in per_seq]
    view = await swarm.view()
    exclude = {hop.peer_id, *exclude, *(p for p, r in view.records.items() if r.quant != hop.record.quant)}
    other_dtype = {p for p, r in view.records.items() if r.dtype != hop.record.dtype}

    def tol(*peers: str) -> float:
        dtypes = [hop.record.dtype, *(view.records[p].dtype for p in peers if p in view.records)]
        return tolerance(*dtypes, mixed=len(set(dtypes)) > 1)

    async def opinion(excluded: set[str], used: list[str]) -> torch.Tensor | None:
        """Same dtype as the hop if any such peer is left, else any dtype."""
        found = await _opinion(swarm, full, lengths, new_tokens, hop, excluded | other_dtype, used)
        if found is None and other_dtype - excluded:
            used.clear()
            found = await _opinion(swarm, full, lengths, new_tokens, hop, excluded, used)
        return found

    first_peers: list[str] = []
    first = await opinion(exclude, first_peers)
    if first is None:
        logger.info("cannot verify %s: no other peer serves layers %s", hop.peer_id, hop.layers)
        return Verdict(use=True)  # nothing to compare with
    if agree(y, first, tol(*first_peers)):
        return Verdict(use=True)
    second_peers: list[str] = []
    second = await opinion(exclude | set(first_peers), second_peers)
    if second is not None:
        if agree(first, second, tol(*first_peers, *second_peers)):
            return Verdict(use=False, liar=hop.peer_id)
        if agree(y, second, tol(*second_peers)) and len(first_peers) == 1:
            return Verdict(use=True, liar=first_peers[0])
    logger.warning("peer %s and %s disagree on layers %s and nothing decides who is right; "
                   "recomputing the step elsewhere", hop.peer_id, first_peers, hop.layers)
    return Verdict(use=False, inconclusive=True)


def fingerprint_outliers(view: SwarmView) -> set[str]:
    """Peers whose fingerprint differs from the one a strict majority of their layer range announces."""
    by_range: dict[tuple[int, int], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for record in view.records.values():
        if record.fingerprint:  # peers of old versions announce none: nothing to compare
            by_range[(record.layers.start, record.layers.end)][record.fingerprint].append(record.peer_id)
    outliers: set[str] = set()
    for groups in by_range.values():
        total = sum(len(peers) for peers in groups.values())
        majority = max(groups, key=lambda fp: len(groups[fp]))
        if 2 * len(groups[majority]) > total:
            outliers.update(p for fp, peers in groups.items() if fp != majority for p in peers)
    return outliers
