"""Models by Hub name: partial downloads into the HF cache, offline reuse, errors that name the fix.

No test reaches the internet: `tests/hub_server.py` answers the Hub's endpoints on 127.0.0.1 and
HF_ENDPOINT points at it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import torch

from peer.prefetch import prefetch_in_background
from peer.quantize_cli import write_quantized
from shards.head import ModelHead
from shards.quant_checkpoint import FORMAT_FILE
from shards.resolve import (
    PREFETCH_ROOM,
    ResolveError,
    fetcher_for_peer,
    is_hub_id,
    prefetch_layers,
    resolve_config,
    resolve_for_client,
    resolve_for_peer,
)
from shards.shard import Shard
from tests.hub_server import HubRepo, HubServer, split_checkpoint

REPO = "test-org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_files(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    folder = tmp_path_factory.mktemp("hub-repo")
    return folder, split_checkpoint(tiny_model, folder)


@pytest.fixture
def hub(hub_files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    folder, _ = hub_files
    with HubServer({REPO: HubRepo(folder, COMMIT)}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield server


def _layer_files(weight_map: dict[str, str], layers: Iterable[int]) -> set[str]:
    return {f for name, f in weight_map.items() if any(name.startswith(f"model.layers.{i}.") for i in layers)}


def test_peer_downloads_only_its_layers(hub: HubServer, hub_files, tiny_model: Path, tmp_path: Path) -> None:
    _, weight_map = hub_files
    source = resolve_for_peer(REPO, None, (0, 2))
    needed = _layer_files(weight_map, range(0, 2))
    assert len(set(weight_map.values())) == 5 and len(needed) == 2  # 4 layer files + the head's
    assert hub.downloaded(REPO) == {"config.json", "model.safetensors.index.json", *needed}
    assert source.default_name == REPO and source.commit == COMMIT
    assert source.path.is_relative_to(tmp_path / "hf-home" / "hub")  # HF_HOME honoured
    shard = Shard.from_pretrained(source.path, 0, 2)
    reference = Shard.from_pretrained(tiny_model, 0, 2)
    assert shard.fingerprint == reference.fingerprint


def test_a_layer_fetcher_brings_each_layer_s_files_as_the_load_reaches_it(hub: HubServer, hub_files,
                                                                          tiny_model: Path) -> None:
    """A move serves each layer as it arrives, so a Hub peer fetches a layer's files only when its load reaches
    that layer, in the load's order: the first layer serves without waiting for the range's files."""
    _, weight_map = hub_files
    fetcher = fetcher_for_peer(REPO, None, (0, 4))
    assert hub.downloaded(REPO) == {"config.json", "model.safetensors.index.json"} and not fetcher.done
    fetched_at: dict[int, set[str]] = {}  # the layer files fetched when each layer had loaded

    def loaded(shard: Shard, layer: int) -> None:
        fetched_at[layer] = hub.downloaded(REPO) - {"config.json", "model.safetensors.index.json"}

    shard = Shard.from_pretrained(fetcher.source.path, 0, 4, order=[2, 1, 3, 0], before_layer=fetcher.fetch,
                                  on_layer=loaded)
    assert fetched_at == {2: _layer_files(weight_map, [2]), 1: _layer_files(weight_map, [1, 2]),
                          3: _layer_files(weight_map, [1, 2, 3]), 0: _layer_files(weight_map, range(4))}
    assert fetcher.done and shard.fingerprint == Shard.from_pretrained(tiny_model, 0, 4).fingerprint
    hub.requests.clear()
    again = fetcher_for_peer(REPO, None, (1, 3))  # cached files: nothing to fetch, and none asked about
    assert again.done and not any(name in path for _, path in hub.requests for name in _layer_files(weight_map, [1, 2]))
    local = fetcher_for_peer(str(tiny_model), None, (0, 4))  # a local folder: nothing to fetch
    assert local.done and local.source.path == tiny_model


def test_a_quantized_checkpoint_by_hub_name_loads_as_quantized(tiny_model: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A `swarm-peer quantize` checkpoint published on the Hub: its quantization.json comes with the weights."""
    folder = tmp_path / "int8"
    write_quantized(tiny_model, folder, "int8", 32, None, 0, 16, "cpu")
    with HubServer({REPO: HubRepo(folder, COMMIT)}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        assert (resolve_config(REPO).path / FORMAT_FILE).is_file()  # a self-placing peer's quant before it joins
        fetcher = fetcher_for_peer(REPO, None, (0, 2))
        assert {FORMAT_FILE, "model.safetensors"} <= server.downloaded(REPO) and fetcher.done
    shard = Shard.from_pretrained(fetcher.source.path, 0, 2)
    assert shard.quant == "int8" and shard.fingerprint == Shard.from_pretrained(folder, 0, 2).fingerprint


def test_client_downloads_head_config_and_tokenizer_only(hub: HubServer, hub_files, tiny_model: Path) -> None:
    _, weight_map = hub_files
    source = resolve_for_client(REPO)
    head_files = {f for name, f in weight_map.items() if not name.startswith("model.layers.")}
    assert hub.downloaded(REPO) == {"config.json", "generation_config.json", "model.safetensors.index.json",
                                    *head_files}
    asked = {path.rsplit("/", 1)[-1] for method, path in hub.requests}
    assert {"tokenizer.json", "tokenizer_config.json"} <= asked  # looked for (the tiny repo has none)
    head, reference = ModelHead.from_pretrained(source.path), ModelHead.from_pretrained(tiny_model)
    assert torch.equal(head.embedding, reference.embedding) and torch.equal(head.lm_head, reference.lm_head)


def test_cache_is_used_offline(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve_for_peer(REPO, None, (0, 2))
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    again = resolve_for_peer(REPO, None, (0, 2))
    assert again.path == first.path and hub.requests == []
    with pytest.raises(ResolveError, match=r"model-\d+-of-\d+\.safetensors unavailable: HF_HUB_OFFLINE is set"):
        resolve_for_peer(REPO, None, (2, 4))  # never downloaded


def test_prefetch_fetches_every_layer_file_once_when_the_disk_has_room(hub: HubServer, hub_files,
                                                                       tiny_model: Path) -> None:
    _, weight_map = hub_files
    layer_files = _layer_files(weight_map, range(4))
    resolve_for_peer(REPO, None, (0, 2))  # the peer's own range first, as a serving peer has
    hub.requests.clear()
    done = prefetch_layers(REPO, None)
    assert done.skipped is None and done.files == len(layer_files) == 4 and done.complete
    assert hub.downloaded(REPO) == layer_files - _layer_files(weight_map, range(2))  # cached ones not again
    source = resolve_for_peer(REPO, None, (2, 4))
    assert hub.downloaded(REPO) == layer_files - _layer_files(weight_map, range(2))  # a later move: from disk
    assert Shard.from_pretrained(source.path, 2, 4).fingerprint == Shard.from_pretrained(tiny_model, 2, 4).fingerprint


def test_prefetch_skips_a_disk_without_room(hub: HubServer) -> None:
    resolve_config(REPO)
    size = prefetch_layers(REPO, None, free_bytes=0).checkpoint_bytes
    assert size is not None and size > 0
    hub.requests.clear()
    done = prefetch_layers(REPO, None, free_bytes=int(PREFETCH_ROOM * size) - 1)
    assert done.files == 0 and "GB free" in done.skipped and "HF_HOME" in done.skipped and not done.complete
    assert hub.downloaded(REPO) == set()  # config and index were cached; no weight file fetched


def test_prefetch_skips_offline(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    done = prefetch_layers(REPO, None)
    assert done.files == 0 and "HF_HUB_OFFLINE" in done.skipped and hub.requests == []


def test_the_background_prefetch_says_when_moves_load_from_disk(hub: HubServer,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # The balancer's react_delay waits behind the peers that load from disk until this is set.
    offline = threading.Event()
    with monkeypatch.context() as m:
        m.setenv("HF_HUB_OFFLINE", "1")
        prefetch_in_background(REPO, None, offline)
    assert not offline.is_set()  # nothing fetched: moves still download
    on_disk = threading.Event()
    prefetch_in_background(REPO, None, on_disk)
    assert on_disk.is_set() and hub.downloaded(REPO)


def test_revision_by_commit_and_config_only(hub: HubServer) -> None:
    source = resolve_config(REPO, COMMIT)
    assert (source.path / "config.json").is_file() and source.commit == COMMIT
    assert hub.downloaded(REPO) == {"config.json"}


@pytest.mark.parametrize(
    ("name", "revision", "expected"),
    [
        ("test-org/nope", None, r"'test-org/nope' at revision 'main': no such repo .*HF_TOKEN"),
        (REPO, "v9", r"'test-org/tiny-llama' at revision 'v9': no such revision"),
        ("not a path or repo", None, r"not a local checkpoint folder nor a Hub repo id"),
    ],
)
def test_errors_name_repo_revision_and_fix(hub: HubServer, name: str, revision: str | None, expected: str) -> None:
    with pytest.raises(ResolveError, match=expected) as info:
        resolve_for_peer(name, revision, (0, 2))
    assert "\n" not in str(info.value)


@pytest.mark.slow  # huggingface_hub retries a refused connection 5 times (~25 s) before giving up
def test_unreachable_hub_without_cache(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ResolveError, match=r"config.json unavailable: the Hub cannot be reached"):
        resolve_config(REPO)


def test_local_folder_wins_and_rejects_revision(tiny_model: Path) -> None:
    assert resolve_for_peer(str(tiny_model), None, (0, 2)).path == tiny_model
    assert not is_hub_id(str(tiny_model)) and is_hub_id(REPO)
    with pytest.raises(ResolveError, match="drop --revision"):
        resolve_config(str(tiny_model), "main")
