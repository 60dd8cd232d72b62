"""shards.pre_read: a layer range's bytes read into the page cache, and nothing but them (real files, mincore)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from shards.loading import data_start, read_header, tensor_files
from shards.pre_read import MEMORY_SHARE, Span, layer_spans, pre_read_layers
from tests.page_cache import any_resident, evict, span_resident
from tests.tiny_models import build_tiny_model

LAYER = re.compile(r"model\.layers\.(\d+)\.")


def tensor_ranges(folder: Path) -> dict[str, tuple[Path, int, int]]:
    """Every tensor's absolute byte range in its file."""
    out = {}
    for name, file in tensor_files(folder).items():
        begin, end = read_header(file)[name]["data_offsets"]
        out[name] = (file, data_start(file) + begin, data_start(file) + end)
    return out


@pytest.fixture(scope="module")
def sharded_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8-layer tiny llama saved in several files with an index (about 160 KB a layer)."""
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("pre-read"), "llama", 8)
    model = AutoModelForCausalLM.from_pretrained(path)
    for file in path.glob("*.safetensors"):
        file.unlink()
    model.save_pretrained(path, safe_serialization=True, max_shard_size="400KB")
    assert len(list(path.glob("*.safetensors"))) >= 3
    return path


def test_spans_cover_exactly_the_layers_tensors(sharded_model: Path) -> None:
    spans = layer_spans(sharded_model, 2, 6)
    ranges = tensor_ranges(sharded_model)
    inside = {name for name, (file, begin, end) in ranges.items()
              if any(s.file == file and s.begin <= begin and end <= s.end for s in spans)}
    wanted = {name for name in ranges if (m := LAYER.match(name)) and 2 <= int(m.group(1)) < 6}
    assert inside == wanted  # every tensor of layers 2-5, none of another layer or the head
    # Merged: no two spans of one file touch, and their bytes add up to the tensors' own.
    assert all(a.file != b.file or a.end < b.begin for a, b in zip(spans, spans[1:]))
    assert sum(s.end - s.begin for s in spans) == sum(end - begin for name, (_, begin, end) in ranges.items()
                                                      if name in wanted)


def test_a_pre_read_leaves_the_layers_in_the_page_cache(sharded_model: Path) -> None:
    spans = layer_spans(sharded_model, 3, 7)
    for file in sharded_model.glob("*.safetensors"):
        evict(file)
    if any_resident(spans):
        pytest.skip("this filesystem keeps evicted pages (posix_fadvise DONTNEED is a hint)")
    read = pre_read_layers(sharded_model, 3, 7, available_bytes=2**40, max_s=60)
    assert read.skipped is None and read.bytes_read == sum(s.end - s.begin for s in spans)
    assert all(span_resident(s) for s in spans)


def test_too_little_memory_missing_files_and_a_halt_read_nothing_more(sharded_model: Path, tmp_path: Path) -> None:
    total = sum(s.end - s.begin for s in layer_spans(sharded_model, 0, 8))
    short = pre_read_layers(sharded_model, 0, 8, available_bytes=int(total / MEMORY_SHARE) - 1, max_s=60)
    assert short.bytes_read == 0 and "available memory" in (short.skipped or "")
    halted = pre_read_layers(sharded_model, 0, 8, available_bytes=2**40, max_s=60, halted=lambda: True)
    assert halted.bytes_read == 0 and halted.skipped == "the move was cancelled"
    # A Hub snapshot holds only the files of the layers it fetched: the others are left out.
    partial = tmp_path / "partial"
    shutil.copytree(sharded_model, partial)
    spans = layer_spans(partial, 0, 8)
    gone = spans[-1].file.name
    (partial / gone).unlink()
    kept = layer_spans(partial, 0, 8)
    assert kept == [Span(partial / s.file.name, s.begin, s.end) for s in spans if s.file.name != gone]
    assert pre_read_layers(partial, 0, 8, available_bytes=2**40, max_s=60).bytes_read == sum(
        s.end - s.begin for s in kept)
    for file in partial.glob("*.safetensors"):
        file.unlink()
    nothing = pre_read_layers(partial, 0, 8, available_bytes=2**40, max_s=60)
    assert nothing.bytes_read == 0 and nothing.skipped == "no weight file of these layers is on disk yet"
