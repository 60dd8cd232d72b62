"""Private swarms: members with the key work; strangers can't read records or open sessions."""

from __future__ import annotations

import asyncio
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import ClientConfig, DistributedModel, SwarmError
from client.local_swarm import LocalSwarm
from swarm import messages as m
from swarm.auth import SwarmKey, SwarmKeyError
from swarm.codec import Limits
from swarm.connection import open_stream
from swarm.dht import SwarmNode
from swarm.errors import RemoteError

pytestmark = pytest.mark.slow


def keygen(path: Path) -> Path:
    out = subprocess.run([sys.executable, "-m", "peer.cli", "keygen", str(path)], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == str(path)
    return path


def test_key_files(tmp_path: Path) -> None:
    path = keygen(tmp_path / "swarm.key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = SwarmKey.load(path)
    sealed = key.seal(b"record", "ctx")
    assert key.open(sealed, "ctx") == b"record"
    assert key.open(sealed, "other-key") is None, "a value moved to another DHT key must not open"
    assert SwarmKey(b"x" * 32).open(sealed, "ctx") is None
    assert key.dht_key("layerswarm/v1/models") != SwarmKey(b"x" * 32).dht_key("layerswarm/v1/models")
    with pytest.raises(FileExistsError):
        SwarmKey.generate(path)
    (tmp_path / "short.key").write_text("tooshort")
    with pytest.raises(SwarmKeyError, match="at least 16 bytes"):
        SwarmKey.load(tmp_path / "short.key")
    with pytest.raises(SwarmKeyError, match="keygen"):
        SwarmKey.load(tmp_path / "missing.key")


def test_members_work_and_strangers_are_refused(tiny_model: Path, local_swarm: LocalSwarm, tmp_path: Path) -> None:
    key = keygen(tmp_path / "swarm.key")
    local_swarm.spawn(["dht", "--swarm-key", str(key)], "dht").wait_for_line("/")
    local_swarm.initial_peers = local_swarm.processes[0].maddrs[:1]
    peer = local_swarm.start_peer(tiny_model, "0:4", "--swarm-key", str(key))

    ids = torch.randint(3, 300, (1, 8), generator=torch.Generator().manual_seed(2))
    expected = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).generate(
        ids, max_new_tokens=8, do_sample=False)
    with DistributedModel.from_pretrained(tiny_model, local_swarm.initial_peers, swarm_key=str(key)) as member:
        assert torch.equal(member.generate(ids, max_new_tokens=8), expected)

    stranger_config = ClientConfig(step_timeout=5, max_retries=1)
    with DistributedModel.from_pretrained(tiny_model, local_swarm.initial_peers, config=stranger_config) as stranger:
        with pytest.raises(SwarmError, match="swarm_key"):
            stranger.generate(ids, max_new_tokens=2)

    other = tmp_path / "other.key"
    keygen(other)
    with SwarmNode(initial_peers=local_swarm.initial_peers, client_mode=True, swarm_key=SwarmKey.load(other)) as node:
        assert node.fetch_view(tiny_model.name).records == {}, "a wrong key must not open the records"

    async def knock() -> RemoteError:
        node = SwarmNode(initial_peers=local_swarm.initial_peers, client_mode=True)
        p2p = await node.replicate_p2p()
        try:
            stream = await open_stream(p2p, peer.peer_id, Limits())
            with pytest.raises(RemoteError) as caught:
                await stream.request({"type": m.INFO}, timeout=10)
            await stream.close()
            return caught.value
        finally:
            await p2p.shutdown()
            node.shutdown()

    refusal = asyncio.run(knock())
    assert refusal.code == "unauthorized" and "--swarm-key" in refusal.message


def test_a_bad_key_file_is_reported_before_loading(tiny_model: Path, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "peer.cli", "serve", "--model", str(tiny_model), "--layers", "0:4",
                          "--swarm-key", str(tmp_path / "nope.key")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "swarm-peer keygen" in out.stderr
