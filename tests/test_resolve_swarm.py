"""A swarm run from a Hub repo id: peers fetch only their layers' files, the client only the head's.

The Hub is `tests/hub_server.py` on 127.0.0.1 (HF_ENDPOINT); no test reaches the internet.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from client import DistributedModel
from tests.hub_server import HubRepo, HubServer, split_checkpoint
from tests.swarm_processes import TEST_ENV, new_test_swarm, wait_until

pytestmark = pytest.mark.slow

REPO = "test-org/tiny-llama"
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


def test_swarm_from_a_hub_repo_id(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weight_map = split_checkpoint(tiny_model, tmp_path / "repo")
    files_of = lambda layers: {f for n, f in weight_map.items() if any(n.startswith(f"model.layers.{i}.") for i in layers)}  # noqa: E731
    with HubServer({REPO: HubRepo(tmp_path / "repo", COMMIT)}) as hub:
        env = dict(TEST_ENV, HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "peer-home"))
        swarm = new_test_swarm(tmp_path / "logs")
        swarm.extra_env = env
        with swarm:
            swarm.start_dht()
            swarm.start_peer(REPO, "0:2")  # type: ignore[arg-type]  # a repo id, not a folder
            assert hub.downloaded(REPO) == {"config.json", "model.safetensors.index.json", *files_of(range(2))}
            hub.requests.clear()
            swarm.start_peer(REPO, "2:4")  # type: ignore[arg-type]
            assert hub.downloaded(REPO) == files_of(range(2, 4))  # config and index come from the cache
            # A self-placing peer (its own empty cache) fetches only the files of the range it chooses...
            swarm.extra_env = dict(env, HF_HOME=str(tmp_path / "mover-home"))
            hub.requests.clear()
            mover = swarm.start_peer(REPO, None, "--num-layers", "2", "--no-prefetch")  # type: ignore[arg-type]
            start, end = map(int, next(line for line in mover.lines if line.startswith("online")).split()[2].split(":"))
            assert end - start == 2
            assert hub.downloaded(REPO) == {"config.json", "model.safetensors.index.json", *files_of(range(start, end))}
            # ... and by default, once it serves, every layer's files in the background (its moves then
            # load from disk), never the head's.
            swarm.extra_env = dict(env, HF_HOME=str(tmp_path / "prefetcher-home"))
            hub.requests.clear()
            prefetcher = swarm.start_peer(REPO, None, "--num-layers", "1")  # type: ignore[arg-type]
            wait_until(lambda: "prefetched" in prefetcher.log_path.read_text(), 60, "the prefetch to finish")
            assert hub.downloaded(REPO) == {"config.json", "model.safetensors.index.json", *files_of(range(4))}

            monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
            monkeypatch.setenv("HF_HOME", str(tmp_path / "client-home"))
            hub.requests.clear()
            remote = DistributedModel.from_pretrained(REPO, swarm.initial_peers)
            try:
                head_files = {f for n, f in weight_map.items() if not n.startswith("model.layers.")}
                assert hub.downloaded(REPO) == {"config.json", "generation_config.json",
                                                "model.safetensors.index.json", *head_files}
                assert remote.model_name == REPO  # the DHT name defaults to the repo id, on both sides
                ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(0))
                out = remote.generate(ids, max_new_tokens=12)
            finally:
                remote.close()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    assert torch.equal(out, reference.generate(ids, max_new_tokens=12, do_sample=False))
