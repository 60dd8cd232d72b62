"""`swarm-peer`: run a bootstrap DHT node, serve layers of a model, or generate text.

stdout carries only machine-readable lines (multiaddrs, then `online PEER_ID START:END`), so
scripts and tests can wait for them; logs go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from peer.config import FaultyOutputs, PeerConfig, ServingLimits
from swarm.types import LayerRange

app = typer.Typer(
    help="layerswarm peer: serve a range of a model's layers to the swarm.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
logger = logging.getLogger("swarm-peer")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"layerswarm {version('layerswarm')}")
        except PackageNotFoundError:
            print("layerswarm (not installed: run `pip install .`)")
        raise typer.Exit()


@app.callback()
def main(
    show_version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print the installed layerswarm version and exit.")] = False,
) -> None:
    """layerswarm peer: serve a range of a model's layers to the swarm."""

InitialPeers = Annotated[
    list[str] | None,
    typer.Option("--initial-peers", help="Multiaddr of a peer already in the swarm (repeatable). None: start a new swarm."),
]
HostMaddrs = Annotated[
    list[str] | None,
    typer.Option("--host-maddrs", help="Multiaddr to listen on (repeatable). Default /ip4/127.0.0.1/tcp/0; use /ip4/0.0.0.0/tcp/PORT to accept other machines."),
]
SwarmKeyFile = Annotated[
    Path | None,
    typer.Option("--swarm-key", help="Secret file of a private swarm (make one with `swarm-peer keygen`); strangers cannot read its records or open sessions."),
]
Identity = Annotated[
    Path | None,
    typer.Option("--identity", help="Private key file; created (mode 0600) if missing, so the peer id survives restarts."),
]


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def say(line: str) -> None:
    """A machine-readable line on stdout, flushed at once (others wait on it)."""
    print(line, flush=True)


def _run_until_signal(main_coro_factory) -> None:
    """Run the coroutine with SIGINT/SIGTERM turned into a clean stop."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main_coro_factory(stop)

    asyncio.run(runner())


@app.command()
def dht(
    host_maddrs: HostMaddrs = None,
    initial_peers: InitialPeers = None,
    identity: Identity = None,
    swarm_key: SwarmKeyFile = None,
    log_level: Annotated[str, typer.Option(help="Logging level on stderr.")] = "info",
) -> None:
    """Run a bootstrap DHT node that others join; prints its multiaddrs on stdout, one per line."""
    setup_logging(log_level)
    from swarm.dht import SwarmNode

    key = load_swarm_key(swarm_key)

    async def main(stop: asyncio.Event) -> None:
        node = SwarmNode(
            swarm_key=key,
            initial_peers=initial_peers or [],
            host_maddrs=host_maddrs or ["/ip4/127.0.0.1/tcp/0"],
            identity_path=str(identity) if identity else None,
        )
        try:
            for addr in node.visible_maddrs():
                say(addr)
            logger.info("DHT node %s is up; Ctrl-C to stop", node.peer_id)
            await stop.wait()
        finally:
            node.shutdown()

    _run_until_signal(main)


@app.command()
def serve(
    model: Annotated[Path, typer.Option("--model", help="Hugging Face checkpoint folder (safetensors + config.json).")],
    layers: Annotated[str | None, typer.Option("--layers", help="Serve exactly these layers, half-open START:END (e.g. 0:15), and never move.")] = None,
    num_layers: Annotated[int | None, typer.Option("--num-layers", help="Serve this many layers where the swarm is weakest, and move when a gap opens. Default (no --layers either): as many as fit in memory.")] = None,
    balance_period: Annotated[float, typer.Option(help="Seconds between checks whether moving would help the swarm (randomised +-25%).")] = 120.0,
    balance_quality: Annotated[float, typer.Option(help="Move only if the swarm's bottleneck throughput grows by more than 1/quality.")] = 0.75,
    initial_peers: InitialPeers = None,
    model_name: Annotated[str | None, typer.Option(help="Name of the model in the DHT. Default: the checkpoint folder's name.")] = None,
    host_maddrs: HostMaddrs = None,
    device: Annotated[str, typer.Option(help="cpu or cuda (cuda:N).")] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    quant: Annotated[str, typer.Option(help="Weight-only quantization while loading: none, int8 (per channel) or int4 (group-wise); fits 2x / ~3.5x more layers. See --dry-run.")] = "none",
    quant_group_size: Annotated[int, typer.Option(help="Group size of int4 quantization: 64 or 128.")] = 128,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the memory this peer needs (weights and KV cache per quantization mode, and how many layers fit) and exit.")] = False,
    cache_tokens: Annotated[int, typer.Option(help="KV cache size in tokens, shared by all sessions.")] = 8192,
    cache_fraction: Annotated[float, typer.Option(help="Size the KV cache to this fraction of the device's free memory after loading the weights (e.g. 0.8 on a GPU) instead of --cache-tokens. 0: use --cache-tokens.")] = 0.0,
    page_size: Annotated[int, typer.Option(help="Tokens per KV cache page.")] = 16,
    public_name: Annotated[str, typer.Option(help="A name shown on the monitor page.")] = "",
    identity: Identity = None,
    swarm_key: SwarmKeyFile = None,
    max_chunk_tokens: Annotated[int, typer.Option(help="Largest batch of tokens per forward pass; long prefills are split into chunks of this size.")] = 512,
    batch_window: Annotated[float, typer.Option(help="Steps of many sessions run as one batched forward pass. When fewer steps are queued than the last batch had, wait at most this many seconds for the others (0: never wait).")] = 0.002,
    no_batching: Annotated[bool, typer.Option("--no-batching", help="Run one step per forward pass (a baseline for benchmarks).")] = False,
    forward_priority: Annotated[int, typer.Option(help="Scheduling priority of stateless forward requests (scoring, verification); inference steps have 0 and lower runs first. Waiting work gains one level every 4 rounds it is passed over, so nothing starves.")] = 1,
    alloc_timeout: Annotated[float, typer.Option(help="Seconds a step waits for free KV pages before a 'busy' error.")] = 5.0,
    announce_ttl: Annotated[float, typer.Option(help="Seconds the DHT keeps our record without a refresh.")] = 30.0,
    max_sessions: Annotated[int, typer.Option(help="Open sessions at most, all clients together.")] = 256,
    max_sessions_per_remote: Annotated[int, typer.Option(help="Open sessions at most per client peer.")] = 64,
    max_length: Annotated[int, typer.Option(help="Tokens at most per sequence of a session.")] = 8192,
    idle_timeout: Annotated[float, typer.Option(help="Seconds without a step before a session is closed.")] = 300.0,
    max_steps_per_second: Annotated[float, typer.Option(help="Steps (and forward passes) per second at most from one client, with bursts of twice that; 0: unlimited.")] = 2000.0,
    max_tensor_elements: Annotated[int, typer.Option(help="Elements at most in one received tensor (checked before anything is allocated).")] = 64 * 2**20,
    max_frame_mb: Annotated[int, typer.Option(help="Largest frame accepted, in MiB.")] = 256,
    max_client_pages_fraction: Annotated[float, typer.Option(help="Share of the KV cache one client may hold at once (its sessions and forward passes together), so one long prompt cannot leave other clients 'busy'. 1: no per-client cap.")] = 0.5,
    share_prefix_across_clients: Annotated[bool, typer.Option("--share-prefix-across-clients", help="Let clients reuse each other's cached prompt prefixes. Only for private swarms whose members all trust each other: a client could plant wrong KV pages under another's prompt. Default: each client shares only with itself.")] = False,
    num_threads: Annotated[int, typer.Option(help="Torch CPU threads (0: torch's default).")] = 0,
    no_cuda_graphs: Annotated[bool, typer.Option("--no-cuda-graphs", help="On CUDA, run decode steps eagerly instead of replaying captured CUDA graphs (slower; for debugging and comparison).")] = False,
    faulty: Annotated[float, typer.Option(hidden=True, help="TEST ONLY: add noise of this std to outputs.")] = 0.0,
    faulty_probability: Annotated[float, typer.Option(hidden=True, help="TEST ONLY: with --faulty, lie on this fraction of results.")] = 1.0,
    log_level: Annotated[str, typer.Option(help="Logging level on stderr.")] = "info",
) -> None:
    """Serve layers of a model to the swarm until Ctrl-C / SIGTERM."""
    setup_logging(log_level)
    layer_range = None
    if layers is not None and num_layers is not None:
        raise typer.BadParameter("give either --layers (fixed) or --num-layers (self-placing), not both")
    if layers is not None:
        try:
            layer_range = LayerRange.parse(layers)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--layers") from None
    if num_layers is not None and num_layers < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--num-layers")
    if not 0 < balance_quality <= 1:
        raise typer.BadParameter("must be in (0, 1]", param_hint="--balance-quality")
    load_swarm_key(swarm_key)  # a bad key file is reported now, not after loading weights
    if quant not in ("none", "int8", "int4"):
        raise typer.BadParameter(f"{quant!r}: choose none, int8 or int4", param_hint="--quant")
    if quant_group_size not in (64, 128):
        raise typer.BadParameter("must be 64 or 128", param_hint="--quant-group-size")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise typer.BadParameter(f"{dtype!r}: choose float32, bfloat16 or float16", param_hint="--dtype")
    if not 0 <= cache_fraction < 1:
        raise typer.BadParameter("must be in [0, 1)", param_hint="--cache-fraction")
    if not 0 < max_client_pages_fraction <= 1:
        raise typer.BadParameter("must be in (0, 1]", param_hint="--max-client-pages-fraction")
    if not model.is_dir():
        raise typer.BadParameter(f"{model} is not a folder; pass a checkpoint folder", param_hint="--model")
    config = PeerConfig(
        model_path=model,
        layers=layer_range,
        num_layers=num_layers,
        balance_period=balance_period,
        balance_quality=balance_quality,
        model_name=model_name or model.resolve().name,
        initial_peers=tuple(initial_peers or ()),
        host_maddrs=tuple(host_maddrs or ("/ip4/127.0.0.1/tcp/0",)),
        identity_path=identity,
        swarm_key=swarm_key,
        device=device,
        dtype=dtype,
        quant=quant,
        quant_group_size=quant_group_size,
        cache_tokens=cache_tokens,
        cache_fraction=cache_fraction,
        batching=not no_batching,
        forward_priority=forward_priority,
        page_size=page_size,
        public_name=public_name,
        announce_ttl=announce_ttl,
        batch_window=batch_window,
        max_chunk_tokens=max_chunk_tokens,
        alloc_timeout=alloc_timeout,
        num_threads=num_threads,
        cuda_graphs=not no_cuda_graphs,
        faulty=FaultyOutputs(faulty, faulty_probability) if faulty > 0 else None,
        limits=ServingLimits(
            max_frame_bytes=max_frame_mb * 2**20,
            max_sessions=max_sessions,
            max_sessions_per_remote=max_sessions_per_remote,
            max_length=max_length,
            idle_timeout=idle_timeout,
            max_steps_per_second=max_steps_per_second,
            max_tensor_elements=max_tensor_elements,
            max_client_pages_fraction=max_client_pages_fraction,
            share_prefix_across_clients=share_prefix_across_clients,
        ),
    )
    if dry_run:
        print_plan(config)
        return

    async def main(stop: asyncio.Event) -> None:
        from peer.server import PeerServer
        from shards.errors import CheckpointError

        server = PeerServer(config)
        try:
            try:
                await server.start()
            except CheckpointError as e:
                logger.error("%s", e)
                raise SystemExit(2) from None
            if not config.initial_peers:
                for addr in server.visible_maddrs():
                    say(addr)
            say(f"online {server.peer_id} {server.layers}")
            await stop.wait()
        finally:
            await server.stop()

    _run_until_signal(main)


def print_plan(config: PeerConfig) -> None:
    """`--dry-run`: the memory plan, without loading weights or joining the swarm."""
    from peer.config import DTYPES
    from peer.memory import describe_plan
    from shards.config import ModelConfig
    from shards.errors import CheckpointError

    try:
        model_config = ModelConfig.from_pretrained(config.model_path)
    except CheckpointError as e:
        raise typer.BadParameter(str(e), param_hint="--model") from None
    count = len(config.layers) if config.layers else (config.num_layers or model_config.num_layers)
    say(describe_plan(model_config, count, DTYPES[config.dtype], config.device, config.cache_tokens,
                      config.quant_group_size))


def load_swarm_key(path: Path | None):
    from swarm.auth import SwarmKey, SwarmKeyError

    if path is None:
        return None
    try:
        return SwarmKey.load(path)
    except SwarmKeyError as e:
        raise typer.BadParameter(str(e), param_hint="--swarm-key") from None


@app.command()
def keygen(path: Annotated[Path, typer.Argument(help="Where to write the new secret (refuses to overwrite).")]) -> None:
    """Create a swarm key file (mode 0600) for a private swarm; give it to every member."""
    from swarm.auth import SwarmKey

    try:
        SwarmKey.generate(path)
    except FileExistsError:
        raise typer.BadParameter(f"{path} exists; remove it first or choose another path") from None
    say(str(path))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def generate(ctx: typer.Context) -> None:
    """Generate text through the swarm (see `swarm-peer generate --help`)."""
    # The client lives in its own package, which the peer must not import; hand over the
    # command line to it in a fresh interpreter instead.
    os.execv(sys.executable, [sys.executable, "-m", "client.cli", *ctx.args])


if __name__ == "__main__":
    app()
