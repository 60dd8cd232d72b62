"""Catching lying peers: per-row comparison, like-for-like tolerance, inconclusive = recompute,
results checked before use, fingerprints by majority; liars via the hidden `--faulty` switch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel, SwarmError
from client.hop import HopSession
from client.local_swarm import LocalSwarm
from client.verify import agree, fingerprint_outliers, row_errors, tolerance
from swarm.errors import RemoteError
from swarm.types import Hop, LayerRange, PeerRecord, SwarmView
from tests.swarm_processes import new_test_swarm


# -- the comparison, in process ---------------------------------------------------------------------------
def test_each_row_is_compared_against_its_own_scale() -> None:
    torch.manual_seed(0)
    honest = torch.randn(4, 64)
    honest[0] *= 40  # a first row with large activations, as real models have
    lie = honest.clone()
    lie[2] += 0.1 * torch.randn(64)  # ~10% of that row: enough to change a token
    # A whole-step scale (the old check) hides it behind row 0; the per-row check does not.
    assert float((lie - honest).abs().max()) <= 1e-3 * (1 + float(honest.abs().max())) * 60
    assert not agree(lie, honest, tolerance("float32"))
    assert row_errors(lie, honest)[[0, 1, 3]].max() == 0
    assert agree(honest + 1e-7 * torch.randn(4, 64), honest, tolerance("float32"))
    assert not agree(honest[:3], honest, 1.0), "a result with rows missing never agrees"


def test_tolerance_is_the_stricter_dtype_unless_peers_compute_in_different_ones() -> None:
    assert tolerance("float32", "bfloat16") == tolerance("float32") < tolerance("bfloat16")
    assert tolerance("made-up") == tolerance("float32"), "an unknown announcement gets no slack"
    assert tolerance("float32", "bfloat16", mixed=True) == tolerance("bfloat16")


def record(peer: str, layers: tuple[int, int], fingerprint: str) -> PeerRecord:
    return PeerRecord(peer_id=peer, model="m", layers=LayerRange(*layers), fingerprint=fingerprint, num_layers=8)


def test_fingerprint_outliers_by_majority_of_the_same_layer_range() -> None:
    records = [record("a", (0, 4), "good"), record("b", (0, 4), "good"), record("c", (0, 4), "evil"),
               record("d", (4, 8), "x"), record("e", (4, 8), "y"),  # a tie decides nothing
               record("f", (0, 8), "z"), record("g", (0, 4), "")]  # alone in its range; no fingerprint
    view = SwarmView("m", 8, {r.peer_id: r for r in records})
    assert fingerprint_outliers(view) == {"c"}


def test_a_result_of_the_wrong_shape_or_not_finite_is_a_hop_failure() -> None:
    hop = HopSession(record("p", (0, 4), "f"), LayerRange(0, 4), batch=1, max_length=8)
    hop._expected = {3: (2, 64)}
    hop._check_result(3, torch.zeros(2, 64))
    for bad in (torch.zeros(0, 64), torch.zeros(2, 32), torch.full((2, 64), float("nan")),
                torch.full((2, 64), float("inf")), torch.zeros(2, 64, dtype=torch.int32)):
        with pytest.raises(RemoteError) as caught:
            hop._check_result(3, bad)
        assert caught.value.code == "bad_reply" and caught.value.retryable


# -- liars through real peers ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def liars(tiny_model: Path, tiny_model_factory, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[LocalSwarm, dict[str, str]]]:
    """A quiet liar (noise of ~2.5% of each row) and a NaN liar, each serving everything in one hop
    (the cheapest route), two disjoint honest routes over the same layers in halves, and an
    impostor serving other weights (another checkpoint of the same shapes) under the model's name."""
    swarm = new_test_swarm(tmp_path_factory.mktemp("liars"))
    try:
        swarm.start_dht()
        names = ["quiet", "nan", "h02a", "h02b", "h24a", "h24b", "impostor"]
        starting = [swarm.start_peer(tiny_model, "0:4", "--faulty", "0.05", wait=False),
                    swarm.start_peer(tiny_model, "0:4", "--faulty", "inf", wait=False)]
        starting += [swarm.start_peer(tiny_model, r, wait=False) for r in ("0:2", "0:2", "2:4", "2:4")]
        starting.append(swarm.start_peer(tiny_model_factory("tied"), "0:2", "--model-name", tiny_model.resolve().name,
                                         wait=False))
        for process in starting:
            swarm.wait_online(process)
        yield swarm, {name: p.peer_id for name, p in zip(names, starting)}
    finally:
        swarm.close()


def reference(path: Path, ids: torch.Tensor) -> torch.Tensor:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).generate(ids, max_new_tokens=10,
                                                                                   do_sample=False)


IDS = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(9))


@pytest.mark.slow
def test_client_catches_a_quiet_liar_and_routes_around_it(tiny_model: Path, liars) -> None:
    swarm, peers = liars
    config = ClientConfig(verify=1.0, step_timeout=30)
    with DistributedModel.from_pretrained(tiny_model, swarm.initial_peers, config=config) as model:
        model.swarm.distrusted.add(peers["nan"])  # this test is about the quiet one
        with model.inference_session(max_length=32) as session:
            out = model.generate(IDS, max_new_tokens=10, session=session)
            assert session.stats.caught >= 1, "verification never caught the quiet liar"
            assert peers["quiet"] not in {h.peer_id for h in session.hops}
        assert peers["quiet"] in model.swarm.distrusted
        reports = model.loop.run(model.swarm.node.fetch_reports_async(model.model_name), timeout=30)
        assert peers["quiet"] in reports and reports[peers["quiet"]][0]["reporter"] == model.swarm.node.peer_id
        honest = {peers[n] for n in ("h02a", "h02b", "h24a", "h24b")}
        assert not honest & set(reports), "an honest peer was blamed"
    assert torch.equal(out, reference(tiny_model, IDS))


@pytest.mark.slow
def test_a_nan_result_is_a_hop_failure_even_without_verification(tiny_model: Path, liars) -> None:
    swarm, peers = liars
    with DistributedModel.from_pretrained(tiny_model, swarm.initial_peers, config=ClientConfig(verify=0.0)) as model:
        model.swarm.distrusted.add(peers["quiet"])
        plan = model.swarm.plan

        async def first_route_through_the_liar(start: int, end: int, *args, **kwargs):
            model.swarm.plan = plan  # later plans (the failover) choose freely
            return (Hop(peers["nan"], LayerRange(0, 4)),)

        model.swarm.plan = first_route_through_the_liar
        with model.inference_session(max_length=32) as session:
            out = model.generate(IDS, max_new_tokens=10, session=session)
            assert session.failures[peers["nan"]] >= 1, "the NaN liar was never on the route"
            assert peers["nan"] not in {h.peer_id for h in session.hops}
    assert torch.equal(out, reference(tiny_model, IDS))


@pytest.mark.slow
def test_an_undecided_disagreement_is_never_used(tiny_model: Path, liars) -> None:
    swarm, peers = liars
    config = ClientConfig(verify=1.0, step_timeout=30, max_retries=3, retry_backoff=0.05)
    with DistributedModel.from_pretrained(tiny_model, swarm.initial_peers, config=config) as model:
        # One honest route and the quiet liar: whoever is checked, there is no third opinion.
        model.swarm.distrusted.update({peers["nan"], peers["h02b"], peers["h24b"]})
        with model.inference_session(max_length=32) as session:
            with pytest.raises(SwarmError, match="disagreeing"):
                model.generate(IDS, max_new_tokens=10, session=session)
            assert session.stats.inconclusive >= 1 and session.stats.caught == 0


@pytest.mark.slow
def test_a_peer_with_other_weights_under_the_models_name_is_never_used(tiny_model: Path, liars) -> None:
    swarm, peers = liars
    with DistributedModel.from_pretrained(tiny_model, swarm.initial_peers, config=ClientConfig(max_retries=1)) as model:
        view = model.loop.run(model.swarm.view(fresh=True), timeout=30)
        assert peers["impostor"] in view.records
        assert fingerprint_outliers(view) == {peers["impostor"]}, "two honest 0:2 peers outvote the impostor"
        # Set the others aside: only the impostor is left for layers 0:2, and it is never routed to.
        model.swarm.distrusted.update({peers[n] for n in ("quiet", "nan", "h02a", "h02b")})
        with pytest.raises(SwarmError, match="no peer serves layers 0-1"):
            model.generate(IDS, max_new_tokens=2)
