"""`swarm-peer serve --quant` and `--dry-run` through the real CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import DistributedModel
from client.local_swarm import LocalSwarm


def test_dry_run_prints_the_plan_per_quantization(tiny_model: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "peer.cli", "serve", "--model", str(tiny_model), "--layers", "0:4",
                          "--dry-run"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.split()[:1] in (["none"], ["int8"], ["int4"])}
    assert set(rows) == {"none", "int8", "int4"}
    weights = {q: float(r[1]) for q, r in rows.items()}
    assert weights["none"] > weights["int8"] > weights["int4"] > 0


@pytest.mark.slow
def test_int8_peer_serves_close_logits(tiny_model: Path, local_swarm: LocalSwarm) -> None:
    local_swarm.start_peer(tiny_model, "0:4", "--quant", "int8")
    peer = local_swarm.processes[0]
    ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(4))
    expected = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)(ids).logits
    with DistributedModel.from_pretrained(tiny_model, peer.maddrs) as model:
        view = model.loop.run(model.swarm.view(fresh=True), timeout=30)
        assert view.records[peer.peer_id].quant == "int8"
        logits = model(ids).logits
    error = (logits - expected).abs().max() / expected.abs().max()
    assert 0 < error < 0.05, f"int8 logits off by {error:.4f} of their scale"
