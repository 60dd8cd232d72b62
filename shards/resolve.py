"""Model resolution: a local checkpoint folder, or a Hugging Face Hub repo id fetched file by file.

A peer needs config.json and only the safetensors files holding its layers (found through the
index's weight map), fetched a layer at a time as its load reaches each (LayerFetcher: a move
serves each layer as it arrives, so it need not wait for the whole range's files); a client
needs config.json, the tokenizer and generation config files and the files holding the
embeddings, final norm and LM head. Both go through `huggingface_hub`'s
cache, so a second start reads from disk. A self-placing peer may fetch every layer's files once
it serves (prefetch_layers), so its later moves read them from disk too. `HF_HOME` /
`HF_HUB_CACHE`, `HF_ENDPOINT`, `HF_HUB_OFFLINE` and `HF_TOKEN` are honoured, read at call time
(not at import) so a process can set them before its first resolution.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from shards.errors import CheckpointError
from shards.loading import INDEX_NAME
from shards.quant_checkpoint import FORMAT_FILE

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
)
LAYER_TENSOR = re.compile(r"^model\.layers\.(\d+)\.")
# prefetch_layers fetches every layer only when the cache's disk has this many times the checkpoint's
# size free: the rest of the disk is the user's, and a full disk would break the peer's own moves.
PREFETCH_ROOM = 1.5
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
T = TypeVar("T")


class ResolveError(CheckpointError):
    """A model name could not be turned into local files; the message names repo, revision and the fix."""


class ModelNotFoundError(ResolveError, FileNotFoundError):
    """The name is neither an existing folder nor a plausible repo id (also a FileNotFoundError)."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are. `repo_id`/`commit` are None for a local folder."""

    path: Path
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None

    @property
    def default_name(self) -> str:
        """The model's name in the DHT unless the user gives one: the repo id, or the folder's name."""
        return self.repo_id or self.path.resolve().name


def is_hub_id(name: str) -> bool:
    """True when `name` is not an existing path and looks like `org/name` (or `name`)."""
    return not Path(name).expanduser().exists() and bool(_REPO_ID.match(name)) and not name.startswith(".")


def resolve_config(name: str, revision: str | None = None) -> ModelSource:
    """Just config.json: enough to check a layer range before anything big is fetched."""
    return _Hub.or_local(name, revision, lambda hub: hub.config())


def resolve_for_peer(name: str, revision: str | None, layers: tuple[int, int] | None) -> ModelSource:
    """config.json plus the weight files of layers [start, end) (all layers when `layers` is None)."""
    return _Hub.or_local(name, revision, lambda hub: hub.weights(lambda t: _in_layers(t, layers)))


@dataclass
class LayerFetcher:
    """A peer's weight files, fetched a layer at a time as its load reaches each layer.

    config.json, the index (and a `swarm-peer quantize` checkpoint's quantization.json) are in the
    cache when it is made; `fetch(layer)` brings the files holding that layer's tensors (each file
    once, cached ones not again). A local folder or a single-file checkpoint (fetched whole when
    made) leaves nothing to fetch.
    """

    source: ModelSource
    files_of_layer: dict[int, tuple[str, ...]] = field(default_factory=dict)  # files not in the cache, by layer
    hub: _Hub | None = None
    fetched: set[str] = field(default_factory=set)

    def fetch(self, layer: int) -> None:
        for file in self.files_of_layer.pop(layer, ()):
            if file not in self.fetched:
                assert self.hub is not None
                self.hub.file(file)
                self.fetched.add(file)

    @property
    def done(self) -> bool:
        """Every layer's files are in: the rest of the load reads the disk."""
        return not self.files_of_layer


def fetcher_for_peer(name: str, revision: str | None, layers: tuple[int, int]) -> LayerFetcher:
    """A LayerFetcher for layers [start, end) of `name` (a local folder or a Hub repo id)."""

    def start(hub: _Hub) -> LayerFetcher:
        weight_map = hub.weight_map()
        if weight_map is None:
            hub.file(SINGLE_FILE)
            return LayerFetcher(hub.source())
        source = hub.source()
        files: dict[int, set[str]] = {}
        for tensor, file in weight_map.items():
            if _in_layers(tensor, layers) and not (source.path / file).is_file():  # a cached file is this commit's
                files.setdefault(_layer_of(tensor), set()).add(file)
        return LayerFetcher(source, {layer: tuple(sorted(f)) for layer, f in files.items()}, hub)

    return _Hub.or_local(name, revision, start, local=LayerFetcher)


def resolve_for_client(name: str, revision: str | None = None) -> ModelSource:
    """config.json, tokenizer and generation config, and the files holding the non-layer tensors."""

    def fetch(hub: _Hub) -> ModelSource:
        for file in (*TOKENIZER_FILES, "generation_config.json"):
            hub.file(file, optional=True)
        return hub.weights(lambda t: LAYER_TENSOR.match(t) is None)

    return _Hub.or_local(name, revision, fetch)


@dataclass(frozen=True)
class Prefetched:
    """What prefetch_layers did."""

    files: int  # weight files of the model's layers now in the cache (0: none fetched, see `skipped`)
    checkpoint_bytes: int | None  # the index's total_size, when it gives one
    skipped: str | None = None  # why nothing was fetched, or None
    complete: bool = False  # every layer's weight files are in the cache now (moves load from disk)


def prefetch_layers(repo_id: str, revision: str | None, free_bytes: int | None = None) -> Prefetched:
    """Every layer's weight files of Hub model `repo_id` into the HF cache, so that a self-placing
    peer's later moves load from disk rather than the network (docs/balancing.md, "Moves from disk").

    Only when the cache's disk has PREFETCH_ROOM times the checkpoint's size free (`free_bytes`:
    that free space, default measured); files already cached are not fetched again.
    """
    hub = _Hub(repo_id, revision)
    if hub.offline:
        return Prefetched(0, None, "HF_HUB_OFFLINE is set (unset it to let moves read from disk)")
    hub.config()
    index = hub.file(INDEX_NAME, optional=True)
    if index is None:
        return Prefetched(1, None, "a single-file checkpoint: the peer's own range already fetched all of it",
                          complete=True)
    try:
        size = json.loads(index.read_text()).get("metadata", {}).get("total_size")
    except (ValueError, AttributeError) as e:
        raise ResolveError(f"{hub._where()}: unreadable {INDEX_NAME} ({e})") from None
    if not isinstance(size, int) or size <= 0:
        return Prefetched(0, None, f"its {INDEX_NAME} gives no total_size, so the disk space it needs is unknown")
    free = shutil.disk_usage(_cache_dir()).free if free_bytes is None else free_bytes
    if free < PREFETCH_ROOM * size:
        return Prefetched(0, size, f"the cache's disk has {free / 1e9:.1f} GB free, less than {PREFETCH_ROOM:g}x the "
                                   f"checkpoint's {size / 1e9:.1f} GB (free space, or point HF_HOME at a larger disk)")
    return Prefetched(len(hub.weight_files(lambda t: _in_layers(t, None))), size, complete=True)


def _in_layers(tensor: str, layers: tuple[int, int] | None) -> bool:
    match = LAYER_TENSOR.match(tensor)
    return match is not None and (layers is None or layers[0] <= int(match.group(1)) < layers[1])


def _layer_of(tensor: str) -> int:
    match = LAYER_TENSOR.match(tensor)
    assert match is not None
    return int(match.group(1))


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE")


def _cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


class _Hub:
    """Downloads of one repo at one revision into the Hugging Face cache (one snapshot folder)."""

    def __init__(self, repo_id: str, revision: str | None) -> None:
        self.repo_id, self.revision = repo_id, revision or "main"
        self.offline = _env_true("HF_HUB_OFFLINE")
        self.endpoint = os.environ.get("HF_ENDPOINT") or None
        self.snapshot: Path | None = None

    @staticmethod
    def or_local(name: str, revision: str | None, fetch: Callable[[_Hub], T],
                 local: Callable[[ModelSource], T] = lambda source: source) -> T:
        """`fetch(hub)` for a Hub repo id; for a local folder, `local` of its ModelSource."""
        folder = Path(name).expanduser()
        if folder.is_dir():
            if revision:
                raise ResolveError(f"--revision applies to Hub models; {folder} is a local folder (drop --revision)")
            return local(ModelSource(path=folder))
        if folder.exists() or not is_hub_id(name):
            raise ModelNotFoundError(
                f"{name!r} is not a local checkpoint folder nor a Hub repo id; pass a folder with config.json "
                "and *.safetensors, or a repo id such as HuggingFaceTB/SmolLM2-135M-Instruct"
            )
        return fetch(_Hub(name, revision))

    def _where(self) -> str:
        return f"{self.repo_id!r} at revision {self.revision!r}"

    def file(self, filename: str, optional: bool = False) -> Path | None:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        try:
            path = Path(hf_hub_download(self.repo_id, filename, revision=self.revision, cache_dir=_cache_dir(),
                                        endpoint=self.endpoint, local_files_only=self.offline))
        except GatedRepoError:
            raise ResolveError(f"{self._where()} is gated: accept its licence on the Hub, then set HF_TOKEN "
                               "to a token of that account") from None
        except RepositoryNotFoundError:
            raise ResolveError(f"{self._where()}: no such repo (or it is private): check the spelling, or set "
                               "HF_TOKEN to a token that can read it") from None
        except RevisionNotFoundError:
            raise ResolveError(f"{self._where()}: no such revision; give a branch, tag or commit that exists "
                               "(--revision), or drop it for 'main'") from None
        except LocalEntryNotFoundError:
            if optional:
                return None
            if self.offline:
                why = "HF_HUB_OFFLINE is set and it is not in the cache; unset HF_HUB_OFFLINE to download it"
            else:
                why = ("the Hub cannot be reached and it is not in the cache; check the network (and "
                       "HF_ENDPOINT, proxy settings)")
            raise ResolveError(f"{self._where()}: {filename} unavailable: {why}, or point HF_HOME at the "
                               f"cache that holds it (looked in {_cache_dir()})") from None
        except EntryNotFoundError:
            if optional:
                return None
            raise ResolveError(f"{self._where()} has no {filename}; is it a transformers checkpoint in "
                               "safetensors format?") from None
        except (HfHubHTTPError, OSError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ResolveError(f"{self._where()}: downloading {filename} failed ({first}); check the network, "
                               "HF_ENDPOINT and HF_TOKEN, then retry") from None
        self.snapshot = path.parent if "/" not in filename else self.snapshot
        return path

    def source(self) -> ModelSource:
        assert self.snapshot is not None
        return ModelSource(path=self.snapshot, repo_id=self.repo_id, revision=self.revision,
                           commit=self.snapshot.name)

    def config(self) -> ModelSource:
        """config.json and, where the repo has one, quantization.json (a `swarm-peer quantize` checkpoint:
        the peer reads its quantization from it before it joins, the loader its tensor layout)."""
        self.file("config.json")
        self.file(FORMAT_FILE, optional=True)
        return self.source()

    def weights(self, wanted) -> ModelSource:
        """config.json, then the index (if any) and each weight file holding a tensor `wanted` accepts."""
        self.weight_files(wanted)
        return self.source()

    def weight_map(self) -> dict[str, str] | None:
        """config() and the index's {tensor: file} (None for a single-file checkpoint)."""
        self.config()
        index = self.file(INDEX_NAME, optional=True)
        if index is None:
            return None
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                raise TypeError("weight_map is not an object of file names")
        except (ValueError, KeyError, TypeError) as e:
            raise ResolveError(f"{self._where()}: unreadable {INDEX_NAME} ({e})") from None
        if any("/" in f or f.startswith(".") for f in weight_map.values()):
            raise ResolveError(f"{self._where()}: {INDEX_NAME} names files outside the repo root")
        return weight_map

    def weight_files(self, wanted) -> list[str]:
        """Fetch what `weights` needs; returns the weight files' names."""
        weight_map = self.weight_map()
        files = [SINGLE_FILE] if weight_map is None else sorted({f for t, f in weight_map.items() if wanted(t)})
        logger.info("%s: using %d weight file(s): %s", self._where(), len(files), ", ".join(files))
        for file in files:
            self.file(file)
        return files
