"""DistributedModel against transformers, through real peer processes on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel, SwarmError
from client.local_swarm import LocalSwarm
from tests.swarm_processes import new_test_swarm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_swarm(tiny_model_factory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, LocalSwarm]]:
    model = tiny_model_factory("gqa", 6)
    swarm = new_test_swarm(tmp_path_factory.mktemp("client-swarm"))
    try:
        swarm.start_dht()
        peers = [swarm.start_peer(model, layers, wait=False) for layers in ("0:3", "3:6")]  # both load at once
        for peer in peers:
            swarm.wait_online(peer)
        yield model, swarm
    finally:
        swarm.close()


@pytest.fixture(scope="module")
def remote(tiny_swarm) -> Iterator[DistributedModel]:
    model_path, swarm = tiny_swarm
    model = DistributedModel.from_pretrained(model_path, swarm.initial_peers)
    try:
        yield model
    finally:
        model.close()


@pytest.fixture(scope="module")
def reference(tiny_swarm):
    return AutoModelForCausalLM.from_pretrained(tiny_swarm[0], dtype=torch.float32).eval()


def prompt(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 300, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("push", [False, True])
def test_greedy_equals_transformers(remote: DistributedModel, reference, push: bool) -> None:
    ids = prompt(20)
    expected = reference.generate(ids, max_new_tokens=30, do_sample=False)
    with remote.inference_session(max_length=64, push=push) as session:
        out = remote.generate(ids, max_new_tokens=30, session=session)
        assert session.stats.steps == 30 and session.stats.failovers == 0
    assert torch.equal(out, expected)
    # Every hop's decode steps were timed, in relay and in push mode (routing uses these, client/measured.py).
    assert all(remote.swarm.measured.layer_tokens_per_second(h.peer_id) > 0 for h in session.hops)


def test_left_padded_batch_equals_transformers(remote: DistributedModel, reference) -> None:
    lengths = [7, 12, 4]
    ids = torch.zeros(3, 12, dtype=torch.long)
    mask = torch.zeros(3, 12, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, 12 - n :] = prompt(n, seed=b)[0]
        mask[b, 12 - n :] = 1
    expected = reference.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    out = remote.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0)
    assert torch.equal(out, expected)


def test_forward_logits_match_transformers(remote: DistributedModel, reference) -> None:
    ids = prompt(16, seed=3)
    ours = remote(ids).logits
    theirs = reference(ids).logits
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max() < 1e-4


def test_multi_turn_session_continues_without_prefill(remote: DistributedModel, reference) -> None:
    first, second = prompt(10, seed=4), prompt(6, seed=5)
    with remote.inference_session(max_length=64) as session:
        out1 = remote.generate(first, max_new_tokens=5, session=session)
        steps_before = session.stats.steps
        out2 = remote.generate(second, max_new_tokens=5, session=session)
        # One step for the new turn (pending token + new prompt), then one per new token.
        assert session.stats.steps - steps_before == 5
    whole = torch.cat([out1, second], dim=1)
    expected = reference.generate(whole, max_new_tokens=5, do_sample=False)
    assert torch.equal(out2[:, -5:], expected[:, -5:])


def test_sampling_is_seeded_and_respects_top_k(remote: DistributedModel) -> None:
    ids = prompt(8, seed=6)
    kwargs = dict(do_sample=True, temperature=0.8, top_k=1, top_p=0.9, repetition_penalty=1.1, max_new_tokens=8)
    greedy_like = remote.generate(ids, **kwargs, generator=torch.Generator().manual_seed(1))
    again = remote.generate(ids, **kwargs, generator=torch.Generator().manual_seed(2))
    assert torch.equal(greedy_like, again), "top_k=1 leaves one candidate whatever the seed"
    loose = dict(kwargs, top_k=0, top_p=1.0, temperature=5.0)
    a = remote.generate(ids, **loose, generator=torch.Generator().manual_seed(1))
    b = remote.generate(ids, **loose, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_min_new_tokens_and_eos(remote: DistributedModel, reference) -> None:
    ids = prompt(10, seed=7)
    free = reference.generate(ids, max_new_tokens=6, do_sample=False)
    eos = int(free[0, 11])  # pretend the second generated token ends the text
    stopped = remote.generate(ids, max_new_tokens=6, eos_token_id=eos)
    expected = reference.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=eos)
    assert torch.equal(stopped, expected)
    forced = remote.generate(ids, max_new_tokens=6, min_new_tokens=4, eos_token_id=eos)
    assert eos not in forced[0, 10:14].tolist()


def test_streamer_sees_every_token(remote: DistributedModel) -> None:
    seen: list[list[int]] = []

    class Recorder:
        def put(self, value: torch.Tensor) -> None:
            seen.append(value.flatten().tolist())

        def end(self) -> None:
            seen.append(["end"])

    ids = prompt(5, seed=8)
    out = remote.generate(ids, max_new_tokens=4, streamer=Recorder())
    assert seen[0] == ids[0].tolist()
    assert [s[0] for s in seen[1:5]] == out[0, 5:].tolist()
    assert seen[-1] == ["end"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(do_sample=True, temperature=0.0), "temperature"),
        (dict(do_sample=True, top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
    ],
)
def test_invalid_sampling_parameters_fail_before_network(remote: DistributedModel, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        remote.generate(prompt(4), **kwargs)


def test_user_mistakes_get_clear_errors(remote: DistributedModel, tiny_swarm) -> None:
    with pytest.raises(ValueError, match="empty"):
        remote.generate(torch.zeros(1, 0, dtype=torch.long))
    with remote.inference_session(max_length=8) as session:
        with pytest.raises(ValueError, match="max_length"):
            remote.generate(prompt(6), max_new_tokens=10, session=session)
    with pytest.raises(FileNotFoundError, match="not a local checkpoint folder"):
        DistributedModel.from_pretrained("/nonexistent/model", ["/ip4/127.0.0.1/tcp/1"])
    model_path, swarm = tiny_swarm
    unknown = DistributedModel.from_pretrained(model_path, swarm.initial_peers, model_name="nobody-serves-this",
                                               config=ClientConfig(step_timeout=5))
    try:
        with pytest.raises(SwarmError, match="no peer serves layers 0-5"):
            unknown.generate(prompt(4), max_new_tokens=2)
    finally:
        unknown.close()
