"""Checks of `swarm-peer`'s options, done before anything starts: each problem is one line that says
what to do (a usage error: exit code 2), never a traceback after minutes of loading or joining."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import typer

from swarm.types import LayerRange

# click's exception classes, from wherever this typer takes them (recent typers vendor click).
click_errors = sys.modules[typer.BadParameter.__module__]


def fail(message: str) -> NoReturn:
    """Stop with one line on stderr (a usage error: exit code 2)."""
    raise click_errors.UsageError(message)


def check_addresses(initial_peers, host_maddrs, announce_maddrs, public_ip, port):
    """Validate the address options now (one line on error), before anything starts."""
    from swarm.reachability import AddressError, parse_peer_maddr, plan_addresses

    try:
        for maddr in initial_peers or ():
            parse_peer_maddr(maddr)
        return plan_addresses(host_maddrs or (), announce_maddrs or (), public_ip, port)
    except AddressError as e:
        fail(str(e))


class StartupError(Exception):
    """The peer could not start or join the swarm; the message says what to check."""


def join_failure(error: Exception, initial_peers) -> str:
    text = " ".join(str(error).split())
    if initial_peers and "bootstrap" in text:
        return (f"cannot reach any initial peer ({', '.join(initial_peers)}): check the address, that the peer "
                "is running, and that its port is open from this machine (firewall, router)")
    if "address already in use" in text:
        return f"the listen port is taken ({text[-200:]}): choose another --port / --host-maddrs"
    return f"the p2p daemon failed to start: {text[:300]}"


def check_device(device: str) -> None:
    """--device names a device torch can use here (checked before any download or join)."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        fail(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N")
    if kind == "cuda" and not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        fail(f"--device {device}: {why}; use --device cpu, or install a CUDA build of torch on a GPU machine")
    if kind == "cuda" and ":" in device and torch.device(device).index >= torch.cuda.device_count():
        fail(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here; use cuda:0..")
    if kind not in ("cpu", "cuda"):
        fail(f"--device {device}: only cpu and cuda are supported")


def resolve_checked(model: str, revision: str | None, layer_range: LayerRange | None, num_layers: int | None,
                    weights: bool):
    """Resolve --model (folder or Hub id), check the layer options against its config, then fetch
    the weight files the peer will load: all before joining the swarm."""
    from shards.config import ModelConfig
    from shards.errors import CheckpointError
    from shards.resolve import resolve_config, resolve_for_peer

    try:
        source = resolve_config(model, revision)
        total = ModelConfig.from_pretrained(source.path).num_layers
        if layer_range is not None and layer_range.end > total:
            fail(f"--layers {layer_range}: {model} has {total} layers; choose a range within 0:{total}")
        if num_layers is not None and num_layers > total:
            fail(f"--num-layers {num_layers}: {model} has only {total} layers")
        if weights:
            source = resolve_for_peer(model, revision, (layer_range.start, layer_range.end) if layer_range else None)
    except CheckpointError as e:
        fail(" ".join(str(e).split()))
    return source


def check_identity(path: Path | None) -> None:
    """Create the identity file if missing, refuse an unusable one: one line now, not a traceback later."""
    from swarm.identity import IdentityError, ensure_identity, load_identity

    if path is None:
        return
    try:
        ensure_identity(str(path))
        load_identity(str(path))
    except IdentityError as e:
        raise typer.BadParameter(str(e), param_hint="--identity") from None


def load_swarm_key(path: Path | None):
    from swarm.auth import SwarmKey, SwarmKeyError

    if path is None:
        return None
    try:
        return SwarmKey.load(path)
    except SwarmKeyError as e:
        raise typer.BadParameter(str(e), param_hint="--swarm-key") from None


def check_serve_options(*, layers: str | None, num_layers: int | None, standby: bool, watch_period: float,
                        balance_quality: float, move_mode: str, announce_ttl: float, quant: str, quant_group_size: int,
                        dtype: str, drain_timeout: float, cache_fraction: float,
                        max_client_pages_fraction: float) -> LayerRange | None:
    """`swarm-peer serve`'s options that need no file, device or network; the fixed --layers range, if given."""
    if layers is not None and num_layers is not None:
        raise typer.BadParameter("give either --layers (fixed) or --num-layers (self-placing), not both")
    layer_range = None
    if layers is not None:
        try:
            layer_range = LayerRange.parse(layers)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--layers") from None
    if standby and layers is not None:
        raise typer.BadParameter("a standby places itself where it is needed: give --num-layers (or nothing), not --layers",
                                 param_hint="--standby")
    if num_layers is not None and num_layers < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--num-layers")
    if not watch_period > 0:
        raise typer.BadParameter("must be > 0 seconds", param_hint="--watch-period")
    if not 0 < balance_quality <= 1:
        raise typer.BadParameter("must be in (0, 1]", param_hint="--balance-quality")
    if move_mode not in ("auto", "beside", "in-place"):
        raise typer.BadParameter(f"{move_mode!r}: choose auto, beside or in-place", param_hint="--move-mode")
    if not 0 < announce_ttl <= 3600:  # the DHT refuses records that claim to live longer than an hour
        raise typer.BadParameter("must be in (0, 3600] seconds", param_hint="--announce-ttl")
    if quant not in ("none", "int8", "int4"):
        raise typer.BadParameter(f"{quant!r}: choose none, int8 or int4", param_hint="--quant")
    if quant_group_size not in (32, 64, 128):
        raise typer.BadParameter("must be 32, 64 or 128", param_hint="--quant-group-size")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise typer.BadParameter(f"{dtype!r}: choose float32, bfloat16 or float16", param_hint="--dtype")
    if drain_timeout < 0:
        raise typer.BadParameter("must be 0 (no drain) or more seconds", param_hint="--drain-timeout")
    if not 0 <= cache_fraction < 1:
        raise typer.BadParameter("must be in [0, 1)", param_hint="--cache-fraction")
    if not 0 < max_client_pages_fraction <= 1:
        raise typer.BadParameter("must be in (0, 1]", param_hint="--max-client-pages-fraction")
    return layer_range
