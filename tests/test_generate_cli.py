"""`swarm-peer generate`: the terminal client streams a reply through a real peer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from client.local_swarm import LocalSwarm

pytestmark = [pytest.mark.slow, pytest.mark.demo_model]


def test_generate_streams_a_reply(demo_model: Path, local_swarm: LocalSwarm) -> None:
    peer = local_swarm.start_peer(demo_model, "0:30")
    out = subprocess.run(
        [sys.executable, "-m", "peer.cli", "generate", "--model", str(demo_model), "--initial-peers", peer.maddrs[0],
         "--max-new-tokens", "8", "What is the capital of France?"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip(), "no text was streamed"
    assert "<|im_end|>" not in out.stdout, "special tokens must not be printed"
    assert "tokens in" in out.stderr and "ms/token" in out.stderr
    helped = subprocess.run([sys.executable, "-m", "peer.cli", "generate", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert "swarm-peer generate" in helped.stdout and "--initial-peers" in helped.stdout
