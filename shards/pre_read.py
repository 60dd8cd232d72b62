"""Read a layer range's weight bytes into the OS page cache ahead of its load (swarm-peer serve --pre-read).

A peer that moves in place frees its old layers and then loads the new ones: until they arrive the
swarm is weaker by the mover's range. A 70B layer reaches an H100 in 1.1 s from its lease's disk and
in 0.23 s from the page cache (docs/performance.md, thirty-seventh session), so a peer that reads a
periodic move's target into memory first, serving on (peer/balancer.py), gives its old range up for
a fifth as long. The load then reads the same files through safetensors' memory map and finds them
resident.

Only the tensors of the asked layers are read, file by file in offset order, in bounded chunks into
one reused buffer: the bytes land in the page cache, not in this process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shards.config import ModelConfig
from shards.loading import data_start, read_header, tensor_files
from shards.quant_checkpoint import read_quant_format
from shards.shard import layer_tensor_names

CHUNK_BYTES = 16 * 2**20  # one read call: large enough for a disk's full speed, small enough to stop soon
# Read only when the bytes fit in this share of the host's available memory: the page cache must keep
# them until the load a few seconds later, and the rest of the host (sessions' host-side state, other
# processes) needs memory too. Past it, the load reads from disk as it would without a pre-read.
MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class Span:
    """Bytes [begin, end) of `file` (absolute offsets): some layers' tensors, adjacent ones merged."""

    file: Path
    begin: int
    end: int


@dataclass(frozen=True)
class PreRead:
    """What pre_read_layers did."""

    bytes_read: int
    seconds: float
    skipped: str | None = None  # why it read nothing (or stopped early), or None


def layer_spans(path: Path, start: int, end: int) -> list[Span]:
    """Where layers [start, end)'s tensors lie in the checkpoint at `path`, by file and offset.

    Files the checkpoint's index names but the folder lacks (a Hub model whose other layers were
    never fetched) are left out: nothing there can be read ahead."""
    config = ModelConfig.from_pretrained(path)
    files = tensor_files(path)
    qformat = read_quant_format(path)
    by_file: dict[Path, list[str]] = {}
    for layer in range(start, end):
        for name in layer_tensor_names(config, layer, qformat):
            if name in files and files[name].is_file():
                by_file.setdefault(files[name], []).append(name)
    spans: list[Span] = []
    for file, names in sorted(by_file.items()):
        header, base = read_header(file), data_start(file)
        ranges = sorted((base + header[n]["data_offsets"][0], base + header[n]["data_offsets"][1])
                        for n in names if n in header)
        for begin, stop in ranges:
            if spans and spans[-1].file == file and begin <= spans[-1].end:
                spans[-1] = Span(file, spans[-1].begin, max(spans[-1].end, stop))
            else:
                spans.append(Span(file, begin, stop))
    return spans


def pre_read_layers(path: Path, start: int, end: int, *, available_bytes: int, max_s: float,
                    halted: Callable[[], bool] = lambda: False) -> PreRead:
    """Read layers [start, end)'s bytes of the checkpoint at `path` so the page cache holds them.

    Nothing is read when they exceed MEMORY_SHARE of `available_bytes` (the host's free memory); the
    read stops early after `max_s` seconds or once `halted()` is true (a cancelled move): the load
    reads the rest from disk. Never raises for an unreadable file: a pre-read is a speed-up only, and
    the load reports what is wrong with the checkpoint."""
    started = time.monotonic()
    try:
        spans = layer_spans(Path(path), start, end)
    except Exception as e:  # the load that follows names the checkpoint's fault
        return PreRead(0, time.monotonic() - started, f"cannot read the checkpoint's headers ({e})")
    total = sum(s.end - s.begin for s in spans)
    if total == 0:
        return PreRead(0, time.monotonic() - started, "no weight file of these layers is on disk yet")
    if total > MEMORY_SHARE * available_bytes:
        return PreRead(0, time.monotonic() - started,
                       f"their {total / 2**30:.1f} GiB exceed {MEMORY_SHARE:.0%} of the host's "
                       f"{available_bytes / 2**30:.1f} GiB of available memory")
    buffer = memoryview(bytearray(min(CHUNK_BYTES, total)))
    done = 0
    for span in spans:
        try:
            with open(span.file, "rb", buffering=0) as f:
                f.seek(span.begin)
                offset = span.begin
                while offset < span.end:  # bounded: every pass reads >= 1 byte or leaves the loop
                    if halted():
                        return PreRead(done, time.monotonic() - started, "the move was cancelled")
                    if time.monotonic() - started > max_s:
                        return PreRead(done, time.monotonic() - started, f"stopped after {max_s:g} s")
                    n = f.readinto(buffer[:min(len(buffer), span.end - offset)])
                    if not n:
                        break  # the file is shorter than its header says: the load will say so
                    offset += n
                    done += n
        except OSError as e:
            return PreRead(done, time.monotonic() - started, f"cannot read {span.file.name} ({e})")
    return PreRead(done, time.monotonic() - started)
