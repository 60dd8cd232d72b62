"""Speculative decoding through real peers: identical greedy output, fewer steps, exact sampling."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM

from client import DistributedModel
from client import speculative as speculative_mod
from client.drafting import AdaptiveK, Draft, PromptLookupDrafter
from client.local_swarm import LocalSwarm, SwarmProcess
from client.sampling import SamplingParams, TokenChooser
from client.session import InferenceSession
from client.speculative import target_scores
from tests.swarm_processes import new_test_swarm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spec_swarm(
    tiny_model_factory, tmp_path_factory
) -> Iterator[tuple[Path, LocalSwarm, dict[str, SwarmProcess]]]:
    """Layers 0:3 served twice, so the failover test can kill the first hop's peer (it runs last)."""
    model = tiny_model_factory("gqa", 6)
    swarm = new_test_swarm(tmp_path_factory.mktemp("spec-swarm"))
    try:
        swarm.start_dht()
        peers = [swarm.start_peer(model, layers, wait=False) for layers in ("0:3", "3:6", "0:3")]
        for peer in peers:
            swarm.wait_online(peer)
        yield model, swarm, {p.peer_id: p for p in peers}
    finally:
        swarm.close()


@pytest.fixture(scope="module")
def remote(spec_swarm) -> Iterator[DistributedModel]:
    model = DistributedModel.from_pretrained(spec_swarm[0], spec_swarm[1].initial_peers)
    try:
        yield model
    finally:
        model.close()


@pytest.fixture(scope="module")
def reference(spec_swarm):
    return AutoModelForCausalLM.from_pretrained(spec_swarm[0], dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def small_draft(spec_swarm, tmp_path_factory) -> Path:
    """The target's first 4 of 6 layers with its own head: same vocabulary, a close-but-different q."""
    model = AutoModelForCausalLM.from_pretrained(spec_swarm[0], dtype=torch.float32)
    model.model.layers = model.model.layers[:4]
    model.config.num_hidden_layers = 4
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:4]
    path = tmp_path_factory.mktemp("draft-4-layers")
    model.save_pretrained(path, safe_serialization=True)
    return path


def repetitive_prompt(reference, seed: int = 0) -> torch.Tensor:
    """x, the model's own greedy continuation of x, then x again: lookup can predict the rest."""
    x = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(seed))
    cont = reference.generate(x, max_new_tokens=20, do_sample=False)
    return torch.cat([cont, x], dim=1)


def test_drafters_and_adaptive_k_units() -> None:
    lookup = PromptLookupDrafter(max_ngram=3, min_ngram=2)
    assert lookup.propose([5, 6, 7, 8, 9, 5, 6, 7], 3).tokens == [8, 9, 5]
    assert lookup.propose([5, 6, 7, 8, 6, 7], 5).tokens == [8, 6, 7]  # 2-gram "6 7" matched
    assert lookup.propose([1, 2, 3, 4], 4).tokens == []
    k = AdaptiveK(initial=4, minimum=1, maximum=8)
    k.update(4, 4)
    assert k.k == 6
    k.update(6, 0)
    assert k.k == 5
    k.update(0, 0)
    assert k.k == 5


def test_prompt_lookup_greedy_identical_with_fewer_steps(remote: DistributedModel, reference) -> None:
    ids = repetitive_prompt(reference)
    expected = reference.generate(ids, max_new_tokens=40, do_sample=False)
    plain = remote.generate(ids, max_new_tokens=40)
    assert (
        remote.last_stats.steps == 40
        and remote.last_stats.drafted == 0
        and remote.last_stats.new_tokens == 40
    )
    out = remote.generate(ids, max_new_tokens=40, speculative="prompt_lookup")
    stats = remote.last_stats
    print(stats)
    assert torch.equal(plain, expected) and torch.equal(out, expected)
    assert stats.new_tokens == 40 and stats.accepted > 0 and stats.steps < 40 and stats.wall_time > 0


@pytest.mark.parametrize("draft", ["same", "small"])
def test_draft_model_greedy_identical(
    remote: DistributedModel, reference, small_draft, spec_swarm, draft
) -> None:
    draft_path = spec_swarm[0] if draft == "same" else small_draft
    ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(3))
    expected = reference.generate(ids, max_new_tokens=30, do_sample=False)
    out = remote.generate(
        ids, max_new_tokens=30, speculative=str(draft_path), num_draft_tokens=4 if draft == "same" else None
    )
    stats = remote.last_stats
    print(draft, stats)
    assert torch.equal(out, expected)
    if draft == "same":  # the target as its own draft: every guess is right
        assert stats.accepted == stats.drafted > 0 and stats.steps <= 30 // 5 + 1


def test_speculative_in_a_multi_turn_session_and_eos(remote: DistributedModel, reference) -> None:
    first = repetitive_prompt(reference, seed=1)
    second = torch.randint(3, 300, (1, 5), generator=torch.Generator().manual_seed(9))
    with remote.inference_session(max_length=128) as session:
        out1 = remote.generate(first, max_new_tokens=12, session=session, speculative="prompt_lookup")
        out2 = remote.generate(second, max_new_tokens=12, session=session, speculative="prompt_lookup")
    assert torch.equal(out1, reference.generate(first, max_new_tokens=12, do_sample=False))
    whole = torch.cat([out1, second], dim=1)
    assert torch.equal(out2[:, -12:], reference.generate(whole, max_new_tokens=12, do_sample=False)[:, -12:])
    eos = int(out1[0, first.shape[1] + 5])  # stop at the 6th generated token, possibly inside a draft
    stopped = remote.generate(first, max_new_tokens=12, eos_token_id=eos, speculative="prompt_lookup")
    assert torch.equal(
        stopped, reference.generate(first, max_new_tokens=12, do_sample=False, eos_token_id=eos)
    )


def test_speculative_refuses_batches(remote: DistributedModel) -> None:
    with pytest.raises(ValueError, match="batch of one"):
        remote.generate(torch.ones(2, 4, dtype=torch.long), speculative="prompt_lookup")
    with pytest.raises(ValueError, match="speculative must be"):
        remote.generate(torch.ones(1, 4, dtype=torch.long), speculative=3)


@pytest.mark.parametrize("point_mass", [True, False])
def test_acceptance_rule_reproduces_p(point_mass: bool) -> None:
    """In-process: draft x ~ q, verify one position; the emitted token must be distributed as p."""
    gen = torch.Generator().manual_seed(0)
    chooser = TokenChooser(SamplingParams(do_sample=True, top_k=0), gen)
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0], [0.0] * 5])  # position 0: p; position 1: unused here
    p = torch.softmax(logits[0], dim=-1)
    q = torch.tensor([0.1, 0.5, 0.1, 0.2, 0.1])
    n, counts = 6000, torch.zeros(5)
    for _ in range(n):
        x = 1 if point_mass else int(torch.multinomial(q, 1, generator=gen))
        out, _ = speculative_mod.verify(chooser, logits, Draft([x], None if point_mass else [q]), [3], 0)
        counts[out[0]] += 1
    stat, p_value = chisquare(counts.numpy(), (p * n).numpy())
    assert p_value > 1e-3, (counts / n, p)


def exact_joint(reference, chooser: TokenChooser, ids: torch.Tensor, n: int) -> dict[tuple[int, ...], float]:
    """The model's exact distribution of its first n sampled tokens (after the same warpers)."""
    dist: dict[tuple[int, ...], float] = {(): 1.0}
    for step in range(n):
        nxt: dict[tuple[int, ...], float] = {}
        for prefix, mass in dist.items():
            context = ids[0].tolist() + list(prefix)
            with torch.no_grad():
                logits = reference(torch.tensor([context])).logits[0, -1]
            p = torch.softmax(target_scores(chooser, logits, context, step)[0], dim=-1)
            for t in torch.nonzero(p > 0).flatten().tolist():
                nxt[prefix + (t,)] = mass * float(p[t])
        dist = nxt
    return dist


@pytest.mark.parametrize("drafter", ["prompt_lookup", "small"])
def test_sampling_distribution_is_exact(remote: DistributedModel, reference, small_draft, drafter) -> None:
    """Chi-square of N speculative samples of the first 3 tokens against the model's exact joint."""
    ids = repetitive_prompt(reference, seed=2)
    kwargs = dict(do_sample=True, temperature=1.5, top_k=3, max_new_tokens=3)
    exact = exact_joint(
        reference,
        TokenChooser(SamplingParams(**{k: v for k, v in kwargs.items() if k != "max_new_tokens"})),
        ids,
        3,
    )
    speculative = "prompt_lookup" if drafter == "prompt_lookup" else str(small_draft)
    gen = torch.Generator().manual_seed(1234)
    counts: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    n = 220
    prompt = ids[0].tolist()
    with remote.inference_session(max_length=64) as session:
        remote.generate(ids[:, :-1], max_new_tokens=1, session=session)  # the peers now hold prompt[:-1]
        for _ in range(n):
            # Rewind the session to "prompt sent but its last token", so each sample reuses the
            # cached prompt instead of opening a session and prefilling again.
            session.truncate(len(prompt) - 1)
            session.token_ids, session.pending = [list(prompt)], [[prompt[-1]]]
            out = remote.generate(
                ids[:, :0],
                **kwargs,
                session=session,
                generator=gen,
                speculative=speculative,
                num_draft_tokens=2,
            )
            counts[tuple(out[0].tolist())] += 1
            drafted, accepted = drafted + remote.last_stats.drafted, accepted + remote.last_stats.accepted
    assert set(counts) <= set(exact), "a sample the model gives probability 0"
    assert 0 < accepted < drafted, f"the test needs both accepted and rejected drafts ({accepted}/{drafted})"
    # Pool cells expected below 5 so the chi-square approximation holds.
    cells = sorted(exact, key=exact.get, reverse=True)
    big = [c for c in cells if exact[c] * n >= 5]
    observed = [counts[c] for c in big] + [n - sum(counts[c] for c in big)]
    expected = [exact[c] * n for c in big] + [n * (1 - sum(exact[c] for c in big))]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    stat, p_value = chisquare(observed, expected)
    tv = 0.5 * sum(abs(counts[c] / n - exact[c]) for c in exact)
    print(
        f"{drafter}: accepted {accepted}/{drafted}, cells {len(big)}, chi2 {stat:.1f}, p {p_value:.3f}, TV {tv:.3f}"
    )
    assert p_value > 1e-3 and tv < 0.25  # TV of 220 samples over ~27 cells is ~0.1 by chance alone


def test_failover_replays_truncated_history(
    remote: DistributedModel, reference, spec_swarm, monkeypatch
) -> None:
    """Drafts get rejected (truncate on every hop), then the first hop's peer is killed: same output."""
    _, _, peers = spec_swarm
    ids = repetitive_prompt(reference, seed=4)
    expected = reference.generate(ids, max_new_tokens=48, do_sample=False)
    truncations: list[int] = []

    class KillAfterTruncation:
        def __init__(self, session: InferenceSession) -> None:
            self.session, self.victim, self.tokens = session, None, 0

        def put(self, value: torch.Tensor) -> None:
            self.tokens += 1
            if self.victim is None and truncations and self.tokens > 12:
                self.victim = peers[self.session.hops[0].peer_id]
                self.victim.kill()

        def end(self) -> None:
            pass

    original = InferenceSession.truncate

    def counting_truncate(session: InferenceSession, length: int) -> None:
        truncations.append(length)
        original(session, length)

    monkeypatch.setattr(InferenceSession, "truncate", counting_truncate)
    with remote.inference_session(max_length=128) as session:
        killer = KillAfterTruncation(session)
        out = remote.generate(
            ids,
            max_new_tokens=48,
            session=session,
            streamer=killer,
            speculative="prompt_lookup",
            num_draft_tokens=3,
        )
        assert killer.victim is not None, "no truncation happened before token 12"
        assert session.stats.failovers >= 1
        assert killer.victim.peer_id not in {h.peer_id for h in session.hops}
        print(f"truncations={len(truncations)} failovers={session.stats.failovers} stats={remote.last_stats}")
    assert torch.equal(out, expected)
