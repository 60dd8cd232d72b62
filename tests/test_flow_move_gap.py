"""A flow move leaves a self-placing peer the only server of a layer next to a gap: it still fills the gap.

The sequence an H200 test found (docs/performance.md, run I), on the CPU with real processes: a
self-placing peer made a flow move from 15:30 to 14:29, so layer 14 had two servers, the fixed
0:15 peer and the mover. The fixed peer was killed. Layers 0:14 went dark, and the mover, now
the only server of layer 14, never moved, because leaving a layer only you serve darkens it. The
fix (routing.plan_move's swarm_down, routing.may_move in the server's confirm check): while some
layer has no server at all no route exists anyway, so a sole server may shift when its target
takes back every layer only it serves.

A flow move's direction turns on throughput differences that tiny CPU models measure within
noise, so the test forces it (peer/balancer.py TEST_FLOW_MOVE_ENV); the crash, the view, the
decision after it, the confirm check and the reload are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel
from client.local_swarm import LocalSwarm
from peer.balancer import TEST_FLOW_MOVE_ENV
from swarm.dht import SwarmNode
from swarm.types import LayerRange, PeerState
from tests.swarm_processes import TEST_ENV, wait_until

pytestmark = pytest.mark.slow
TTL = "3"  # --announce-ttl: the killed peer's record vanishes within 3 s
FLOW_MOVE = LayerRange(14, 29)


def serving(node: SwarmNode, model: str) -> dict[str, LayerRange]:
    return {r.peer_id: r.layers for r in node.fetch_view(model).records.values() if r.state is PeerState.ONLINE}


def test_a_sole_server_a_flow_move_left_next_to_a_gap_fills_it(tiny_model_factory, tmp_path: Path) -> None:
    model_path: Path = tiny_model_factory("llama", 30)
    name = model_path.resolve().name
    # Every process gets the variable; only the self-placing peer runs a balance loop that reads it.
    with LocalSwarm(tmp_path, {**TEST_ENV, TEST_FLOW_MOVE_ENV: str(FLOW_MOVE)}) as swarm:
        swarm.start_dht()
        first = swarm.start_peer(model_path, "0:15", "--announce-ttl", TTL)
        # --balance-quality 0.3: no strength move on measurement noise (a 3.3x difference is
        # needed), so nothing but the forced flow move happens before the crash; a gap is
        # infinitely weak, so the move after it is unchanged.
        mover = swarm.start_peer(model_path, None, "--num-layers", "15", "--balance-period", "2", "--move-mode",
                                 "in-place", "--balance-quality", "0.3", "--announce-ttl", TTL, "--pre-read")
        node = SwarmNode(initial_peers=swarm.initial_peers, client_mode=True)
        try:
            wait_until(lambda: serving(node, name).get(mover.peer_id) == LayerRange(15, 30), 20,
                       "the mover on the uncovered 15:30")
            second_came = len(mover.log_text())  # the mover's log from here on is its flow move's
            second = swarm.start_peer(model_path, "15:30", "--announce-ttl", TTL)
            # The mover may leave 15:30 now (second serves it): its next check makes the flow move.
            wait_until(lambda: serving(node, name).get(mover.peer_id) == FLOW_MOVE, 40,
                       f"the mover's flow move to {FLOW_MOVE}", poll=0.5)
            log = mover.log_text()
            assert f"the swarm's max flow runs dry in {FLOW_MOVE}: moving there from 15:30" in log, mover.log_tail()
            # A periodic move reads its layers into memory first (--pre-read), then is decided on again. On a
            # loaded machine a record may miss one 1-s refresh of its 3-s TTL and wake the mover into a
            # reaction, which moves at once (no pre-read); its log says so, and only then is the read not due.
            moved = log.index(f"moving from layers 15:30 to {FLOW_MOVE}")
            reading = log.rfind(f"moving to layers {FLOW_MOVE} would help the swarm: reading", second_came, moved)
            reacted = log.rfind("deciding now", second_came, moved)
            if reacted < 0 or reacted < reading:
                read = log.find(f"of layers {FLOW_MOVE} into memory in", max(reading, 0))
                assert 0 <= reading < read < moved, mover.log_tail()
            now = serving(node, name)
            assert now == {first.peer_id: LayerRange(0, 15), mover.peer_id: FLOW_MOVE,
                           second.peer_id: LayerRange(15, 30)}, now

            first.kill()  # 0:14 goes dark; layer 14 is left to the mover alone
            killed_log = len(mover.log_text())

            def gap_closed() -> bool:
                # The mover's log too: its record may list the whole range (a periodic refresh) a few
                # ms before the move's end is logged, and on a loaded machine the view is read between.
                view = node.fetch_view(name)
                return (first.peer_id not in view.records and view.uncovered_layers() == []
                        and "now serving layers 0:15" in mover.log_text()[killed_log:])

            # Record expiry (3 s), a watch read (<= 6.25 s), the react wait (7.5 s), the confirm
            # check (1 s) and a tiny model's reload: well under a minute.
            wait_until(gap_closed, 60, "the layers the killed peer served alone to be served again", poll=0.5)
            after = mover.log_text()[killed_log:]
            assert "now serving layers 0:15" in after, mover.log_tail()
            assert "for now" not in after, "the confirm check refused the move"
            assert serving(node, name) == {mover.peer_id: LayerRange(0, 15), second.peer_id: LayerRange(15, 30)}

            ids = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(11))
            expected = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).generate(
                ids, max_new_tokens=12, do_sample=False)
            config = ClientConfig(step_timeout=5, max_retries=8, retry_backoff=0.3)
            with DistributedModel.from_pretrained(model_path, swarm.initial_peers, config=config) as model:
                assert torch.equal(model.generate(ids, max_new_tokens=12), expected)
        finally:
            node.shutdown()
