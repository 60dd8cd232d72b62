"""Per-client limits: steps per second and tensor size, refused with clear errors and counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from client.local_swarm import LocalSwarm
from peer.rate_limit import RateLimiter
from swarm import messages as m
from swarm.codec import Limits, encode_tensor
from swarm.connection import open_stream
from swarm.dht import SwarmNode
from swarm.errors import RemoteError


def test_token_bucket() -> None:
    limiter = RateLimiter(rate=2, burst=3)
    assert [limiter.allow("a", now=0.0) for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("b", now=0.0), "clients have separate buckets"
    assert not limiter.allow("a", now=0.2)  # 0.4 tokens refilled: still short
    assert limiter.allow("a", now=0.5)  # 1 token refilled
    assert RateLimiter(rate=0).allow("a", now=0.0), "rate 0 means unlimited"
    crowded = RateLimiter(rate=1, burst=1, max_remotes=10)
    for i in range(100):
        crowded.allow(f"stranger-{i}", now=float(i))
    assert len(crowded._buckets) <= 10, "memory stays bounded when ids rotate"


@pytest.mark.slow
def test_rate_and_tensor_limits_on_a_real_peer(tiny_model: Path, local_swarm: LocalSwarm) -> None:
    peer = local_swarm.start_peer(tiny_model, "0:4", "--max-steps-per-second", "5", "--max-tensor-elements", "4096")

    async def drive() -> tuple[list[str], str, dict]:
        node = SwarmNode(initial_peers=peer.maddrs, client_mode=True)
        p2p = await node.replicate_p2p()
        try:
            stream = await open_stream(p2p, peer.peer_id, Limits())
            codes = []
            for _ in range(20):  # far above 5/s with bursts of 10
                try:
                    await stream.request({"type": m.FORWARD, "hidden": encode_tensor(torch.randn(2, 64)),
                                          "new_tokens": [2]}, timeout=10)
                    codes.append("ok")
                except RemoteError as e:
                    codes.append(e.code)
            await asyncio.sleep(1.0)  # the bucket refills
            with pytest.raises(RemoteError) as too_big:
                await stream.request({"type": m.FORWARD, "hidden": encode_tensor(torch.randn(65, 64)),
                                      "new_tokens": [65]}, timeout=10)
            info = await stream.request({"type": m.INFO}, timeout=10)
            await stream.close()
            return codes, too_big.value.code, info["stats"]
        finally:
            await p2p.shutdown()
            node.shutdown()

    codes, too_big, stats = asyncio.run(drive())
    assert codes.count("ok") >= 5 and "rate_limited" in codes, codes
    assert too_big == "too_large"
    assert stats["errors"]["rate_limited"] == codes.count("rate_limited")
    assert stats["errors"]["too_large"] >= 1
