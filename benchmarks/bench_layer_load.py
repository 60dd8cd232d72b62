"""How long a peer takes to load one layer from its own disk: what a move costs once the model's
files are local (swarm-peer serve --prefetch), against a first fetch from the network.

Writes a checkpoint of a few Llama-2-70B-shaped layers (bf16, one file per layer, 1.71 GB each), then
times `Shard.from_pretrained`, the loader every peer uses, reading them onto `--device` (cuda: until the
weights are on the GPU, the copy synchronised, as a GPU peer's move loads them):
  * cold: the page cache dropped first (as root: /proc/sys/vm/drop_caches; else each file's pages
    evicted with posix_fadvise), a read from the disk;
  * warm: the files already in the page cache (a move back to layers read recently);
each with the peer's loader (the mapped files read by the host-to-device copy) and, where installed,
fastsafetensors (parallel reads, no mmap) reading the same files whole, for comparison; and
  * pre-read: the page cache dropped, the layers read into it by shards.pre_read (what a peer does for a
    periodic move before it makes it, serving on: swarm-peer serve --pre-read), then loaded: the load is
    the time a mover in place serves nothing.
The same bytes from a network link take size / bandwidth: printed for 1 Gbit/s for comparison.
With --quant int8 (or int4) the bf16 layers are first written as the quantized checkpoint a peer
serves (`swarm-peer quantize`'s writer, round to nearest) and that is what is timed: half (a quarter)
of the bytes to read for the same layer.

    .venv/bin/python -m benchmarks.bench_layer_load --layers 2 --repeat 3 [--device cuda] [--quant int8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import torch

from peer.quantize_cli import write_quantized
from shards.loading import read_header
from shards.pre_read import pre_read_layers
from shards.shard import Shard

LLAMA2_70B = dict(
    hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
    vocab_size=1024, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)  # fmt: skip  (a tiny vocabulary: the head is not what a move loads)
GBIT_BYTES_PER_S = 125e6


def write_checkpoint(path: Path, layers: int) -> int:
    """Random bf16 layers of the Llama-2-70B shape, one safetensors file each; returns the layer bytes."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    c = LLAMA2_70B
    LlamaConfig(**c, num_hidden_layers=layers, dtype="bfloat16").save_pretrained(path)
    H, F, KV = c["hidden_size"], c["intermediate_size"], c["num_key_value_heads"] * c["head_dim"]
    gen = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    head = {"model.embed_tokens.weight": torch.zeros(c["vocab_size"], H, dtype=torch.bfloat16),
            "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
            "lm_head.weight": torch.zeros(c["vocab_size"], H, dtype=torch.bfloat16)}
    files = [("model-head.safetensors", head)]
    for layer in range(layers):
        p = f"model.layers.{layer}."
        shapes = {"self_attn.q_proj": (H, H), "self_attn.k_proj": (KV, H), "self_attn.v_proj": (KV, H),
                  "self_attn.o_proj": (H, H), "mlp.gate_proj": (F, H), "mlp.up_proj": (F, H), "mlp.down_proj": (H, F)}
        tensors = {p + name + ".weight": (torch.randn(*shape, generator=gen) * shape[1] ** -0.5).to(torch.bfloat16)
                   for name, shape in shapes.items()}
        tensors[p + "input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        files.append((f"model-layer-{layer:03d}.safetensors", tensors))
    for name, tensors in files:
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        for key, t in tensors.items():
            weight_map[key] = name
            total += t.numel() * t.element_size() if ".layers." in key else 0
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return total


def quantized_copy(path: Path, quant: str) -> tuple[Path, int]:
    """The bf16 checkpoint at `path` written as a quantized one beside it (round to nearest, as
    `swarm-peer quantize --quant int8` or `--rtn` writes it); returns its folder and its layers' bytes."""
    out = path / f"quantized-{quant}"
    write_quantized(path, out, quant, group_size=128, text_file=None, calibration_tokens=0, seq_len=0, device="cpu")
    header = read_header(out / "model.safetensors")
    return out, sum(entry["data_offsets"][1] - entry["data_offsets"][0] for key, entry in header.items()
                    if ".layers." in key)


def drop_page_cache(path: Path) -> bool:
    """Evict the checkpoint's files from the page cache: all of it as root, else each file's own pages
    (posix_fadvise DONTNEED, allowed on files we can read). False when neither works."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        pass
    try:
        for file in path.glob("*.safetensors"):
            fd = os.open(file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    except (OSError, AttributeError):
        return False
    return True


@dataclass(frozen=True)
class Load:
    seconds: float  # until every layer is on the device
    first_layer_s: float  # until the first layer was on the device (a growing move serves it from then on)


def timed_load(path: Path, layers: int, device: str) -> Load:
    """One load of layers 0..layers-1 by the peer's loader."""
    synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    first: list[float] = []

    def arrived(shard: Shard, layer: int) -> None:
        if not first:
            synchronize()
            first.append(time.perf_counter() - started)

    started = time.perf_counter()
    shard = Shard.from_pretrained(path, 0, layers, dtype=torch.bfloat16, device=device, on_layer=arrived)
    synchronize()
    load = Load(time.perf_counter() - started, first[0])
    del shard
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return load


def timed_fastsafetensors(path: Path, device: str) -> float:
    """Seconds for fastsafetensors (parallel reads, no mmap) to read the same files whole onto `device`."""
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    files = sorted(str(f) for f in path.glob("model-layer-*.safetensors"))
    started = time.perf_counter()
    loader = SafeTensorsFileLoader(SingleGroup(), torch.device(device if ":" in device else f"{device}:0"), nogds=True)
    try:
        loader.add_filenames({0: files})
        buffers = loader.copy_files_to_device()
        tensors = [buffers.get_tensor(name) for name in buffers.key_to_rank_lidx]
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        del tensors
        buffers.close()
    finally:
        loader.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2, help="layers written and loaded (1.71 GB each)")
    ap.add_argument("--repeat", type=int, default=3, help="timed loads per source and loader (the median is reported)")
    ap.add_argument("--device", default="cpu", help="where the loaded weights go: cpu, or cuda (a GPU peer's load)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the checkpoint (default: a temp dir)")
    ap.add_argument("--quant", choices=("none", "int8", "int4"), default="none",
                    help="time the layers written as a checkpoint quantized to this (swarm-peer quantize's "
                         "writer, round to nearest): what a peer serving that checkpoint reads")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "layer_load.json")
    a = ap.parse_args()
    cold: list[Load] = []
    warm: list[Load] = []
    fast: dict[str, list[float]] = {"cold": [], "warm": []}
    pre_read_s: list[float] = []  # the page cache dropped, the layers read into it (shards.pre_read) ...
    after_pre_read: list[Load] = []  # ... and then loaded
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        path = Path(tmp)
        print(f"writing {a.layers} Llama-2-70B-shaped bf16 layers to {path} ...", flush=True)
        size = write_checkpoint(path, a.layers)
        if a.quant != "none":
            print(f"quantizing them to {a.quant} (round to nearest) ...", flush=True)
            path, size = quantized_copy(path, a.quant)  # the bf16 files stay: the cache drop evicts only path's
        per_layer_gb = size / a.layers / 1e9
        can_drop = drop_page_cache(path)
        if not can_drop:
            print("cannot evict the page cache here: cold loads skipped")
        timed_load(path, 1, a.device)  # CUDA initialised, the code paths warm
        use_fast = (a.device.startswith("cuda") and a.quant == "none"  # it reads the bf16 layer files
                    and importlib.util.find_spec("fastsafetensors") is not None)
        for _ in range(a.repeat):  # the loaders interleaved, so a drift of the disk touches both alike
            if can_drop and drop_page_cache(path):
                cold.append(timed_load(path, a.layers, a.device))
            timed_load(path, a.layers, a.device)  # into the page cache
            warm.append(timed_load(path, a.layers, a.device))
            if can_drop and drop_page_cache(path):
                read = pre_read_layers(path, 0, a.layers, available_bytes=2**50, max_s=3600)
                if read.skipped is None:
                    pre_read_s.append(read.seconds)
                    after_pre_read.append(timed_load(path, a.layers, a.device))
            if use_fast:
                try:
                    if can_drop and drop_page_cache(path):
                        fast["cold"].append(timed_fastsafetensors(path, a.device))
                    fast["warm"].append(timed_fastsafetensors(path, a.device))
                except Exception as e:  # a research prototype: report it, never fail the benchmark
                    print(f"fastsafetensors failed: {type(e).__name__}: {e}")
                    use_fast = False
    network = per_layer_gb * 1e9 / GBIT_BYTES_PER_S
    where = torch.cuda.get_device_name(a.device) if a.device.startswith("cuda") else "the CPU"
    weights = "bf16" if a.quant == "none" else a.quant
    print(f"\nLlama-2-70B-shaped layer, {weights}, {per_layer_gb:.2f} GB; {a.layers} layers loaded onto {where}, "
          f"{os.cpu_count()} cores; medians of {a.repeat}")
    print(f"{'source':28} {'loader':34} {'s / layer':>9} {'GB/s':>6} {'first layer s':>13}")
    rows = []
    for source, loads in (("disk, page cache dropped", cold), ("page cache (warm)", warm)):
        if loads:
            per_layer = statistics.median(x.seconds for x in loads) / a.layers
            rows.append((source, "Shard.from_pretrained", per_layer, statistics.median(x.first_layer_s for x in loads)))
    if pre_read_s:
        rows.append(("disk, page cache dropped", "pre_read_layers (into memory)", statistics.median(pre_read_s) / a.layers,
                     None))
        rows.append(("after the pre-read", "Shard.from_pretrained", statistics.median(x.seconds for x in after_pre_read)
                     / a.layers, statistics.median(x.first_layer_s for x in after_pre_read)))
    for source, key in (("disk, page cache dropped", "cold"), ("page cache (warm)", "warm")):
        if fast[key]:
            rows.append((source, "fastsafetensors (whole files)", statistics.median(fast[key]) / a.layers, None))
    rows.append(("1 Gbit/s link", "size / bandwidth", network, None))
    for source, loader, per_layer, first in rows:
        first_text = "-" if first is None else f"{first:.2f}"
        print(f"{source:28} {loader:34} {per_layer:9.2f} {per_layer_gb / per_layer:6.2f} {first_text:>13}")
    result = {"date": date.today().isoformat(), "machine": platform.node(), "cpus": os.cpu_count(), "device": where,
              "quant": a.quant, "layer_gb": per_layer_gb, "layers": a.layers, "repeat": a.repeat,
              "cold": [asdict(x) for x in cold], "warm": [asdict(x) for x in warm],
              "fastsafetensors_s": fast, "pre_read_s": pre_read_s, "after_pre_read": [asdict(x) for x in after_pre_read],
              "gbit_link_s_per_layer": network}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(result, indent=1))
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
