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

from peer.cli_checks import (
    StartupError,
    check_addresses,
    check_device,
    check_identity,
    check_serve_options,
    click_errors,
    join_failure,
    load_swarm_key,
    resolve_checked,
)
from peer.config import WATCH_PERIOD_S, FaultyOutputs, PeerConfig, ServingLimits
from peer.drain_cli import drain
from peer.quantize_cli import checkpoint_quant, quantize
from routing.flow_move import (
    FLOW_MOVE_COOLDOWN_S,
    FLOW_MOVE_GAIN,
    FLOW_MOVE_GAIN_FLOOR,
    MOVER_SHARE_GAIN,
    SHORTFALL_CUT,
)
from routing.move_gate import GATE_MARGIN
from swarm.launcher import exit_with_launcher


class _OneLineErrors(typer.Typer):
    """Usage errors as ONE line on stderr saying what is wrong and what to do, exit code 2, no traceback."""

    def __call__(self, *args, **kwargs):
        try:
            result = super().__call__(*args, standalone_mode=False, **kwargs)
        except click_errors.ClickException as e:
            if type(e).__name__ == "NoArgsIsHelpError":
                print(e.ctx.get_help())
                sys.exit(2)
            where = e.ctx.command_path if getattr(e, "ctx", None) else "swarm-peer"
            message = " ".join(e.format_message().split())
            print(f"{where}: error: {message}", file=sys.stderr)
            sys.exit(e.exit_code)
        except typer.Abort:
            print("aborted", file=sys.stderr)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


app = _OneLineErrors(
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
    exit_with_launcher()  # started by a demo, benchmark or test: stop when it dies (swarm/launcher.py)

InitialPeers = Annotated[
    list[str] | None,
    typer.Option("--initial-peers", help="Multiaddr of a peer already in the swarm (repeatable). None: start a new swarm."),
]
HostMaddrs = Annotated[
    list[str] | None,
    typer.Option("--host-maddrs", help="Multiaddr to listen on (repeatable). Default /ip4/127.0.0.1/tcp/0; use /ip4/0.0.0.0/tcp/PORT to accept other machines."),
]
AnnounceMaddrs = Annotated[
    list[str] | None,
    typer.Option("--announce-maddrs", help="Multiaddr others should dial to reach us (repeatable), e.g. /ip4/PUBLIC_IP/tcp/PORT when a router forwards PORT here. Default: the addresses we listen on."),
]
PublicIp = Annotated[
    str | None,
    typer.Option("--public-ip", help="Shorthand: announce this IP at --port (the router's public address that forwards --port to this machine)."),
]
Port = Annotated[
    int | None,
    typer.Option("--port", help="Shorthand: listen on every interface at this TCP and UDP (QUIC) port, e.g. 31337; forward it on your router to serve from home."),
]
NoRelay = Annotated[
    bool,
    typer.Option("--no-relay", help="Do not use libp2p circuit relays (neither to reach relayed peers nor, when others cannot dial us, to be reached). Relays are on by default."),
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
    for chatty in ("httpx", "httpx2", "httpcore"):  # huggingface_hub's HTTP client logs each request at INFO
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))


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

    try:
        asyncio.run(runner())
    except StartupError as e:  # after the clean-up above: the last line the user sees says what to do
        print(f"swarm-peer: error: {e}", file=sys.stderr)
        sys.exit(2)


@app.command()
def dht(
    host_maddrs: HostMaddrs = None,
    announce_maddrs: AnnounceMaddrs = None,
    public_ip: PublicIp = None,
    port: Port = None,
    no_relay: NoRelay = False,
    initial_peers: InitialPeers = None,
    identity: Identity = None,
    swarm_key: SwarmKeyFile = None,
    log_level: Annotated[str, typer.Option(help="Logging level on stderr.")] = "info",
) -> None:
    """Run a bootstrap DHT node that others join; prints its multiaddrs on stdout, one per line."""
    setup_logging(log_level)
    from swarm.dht import SwarmNode
    from swarm.reachability import DialBackService, join_advice

    key = load_swarm_key(swarm_key)
    check_identity(identity)
    addresses = check_addresses(initial_peers, host_maddrs, announce_maddrs, public_ip, port)

    async def main(stop: asyncio.Event) -> None:
        node = await start_node(lambda: SwarmNode(
            swarm_key=key,
            initial_peers=initial_peers or [],
            host_maddrs=addresses.host,
            announce_maddrs=addresses.announce,
            use_relay=not no_relay,
            identity_path=str(identity) if identity else None,
        ), initial_peers)
        dial_back = DialBackService()  # answers joining peers' "can you reach me?"
        try:
            await dial_back.attach(p2p := await node.replicate_p2p())
            for addr in node.visible_maddrs():
                say(addr)
            logger.info("DHT node %s is up; %s; Ctrl-C to stop", node.peer_id, join_advice(node.visible_maddrs()))
            await stop.wait()
        finally:
            await dial_back.close()
            await p2p.shutdown()
            node.shutdown()

    _run_until_signal(main)


async def start_node(make_node, initial_peers):
    """Start a SwarmNode off the event loop; a daemon that cannot start or join is one line, exit code 2."""
    from hivemind.p2p import P2PDaemonError

    try:
        return await asyncio.get_running_loop().run_in_executor(None, make_node)
    except (P2PDaemonError, TimeoutError) as e:
        raise StartupError(join_failure(e, initial_peers)) from None


@app.command()
def serve(
    model: Annotated[str, typer.Option("--model", help="A checkpoint folder (safetensors + config.json) or a Hugging Face Hub repo id (e.g. HuggingFaceTB/SmolLM2-135M-Instruct): only config.json and the files holding the served layers are downloaded, into the HF cache (HF_HOME; HF_HUB_OFFLINE=1 uses the cache only; HF_TOKEN for gated or private repos).")],
    revision: Annotated[str | None, typer.Option("--revision", help="Branch, tag or commit of a Hub --model (default: main).")] = None,
    layers: Annotated[str | None, typer.Option("--layers", help="Serve exactly these layers, half-open START:END (e.g. 0:15), and never move.")] = None,
    num_layers: Annotated[int | None, typer.Option("--num-layers", help="Serve this many layers where the swarm is weakest, and move when a gap opens. Default (no --layers either): as many as fit in memory.")] = None,
    balance_period: Annotated[float, typer.Option(help="Seconds between checks whether moving would help the swarm (randomised +-25%).")] = 120.0,
    watch_period: Annotated[float, typer.Option(help=f"Seconds between a self-placing peer's (or standby's) reads of the swarm between balance checks (randomised +-25%), to take over at once layers a departure leaves without a server or thin. Crash notices from clients and other peers wake it sooner, so a longer period mostly saves DHT reads (drains and moves are still seen only at a read). Default {WATCH_PERIOD_S:g}.")] = WATCH_PERIOD_S,
    balance_quality: Annotated[float, typer.Option(help=f"Move only if the weakest layers a move touches grow by more than 1/quality; at a periodic check (not a reaction to a departure's hole) only if the move also gives a layer with one server a second or raises the swarm's max flow by {GATE_MARGIN:.1%} (routing/move_gate.py). Besides, at most every {FLOW_MOVE_COOLDOWN_S / 60:.0f} minutes, a peer moves where the swarm's max flow runs dry when that cuts by {SHORTFALL_CUT:.0%} what the swarm lacks for a rise of {MOVER_SHARE_GAIN:g}x the peer's share of the swarm's capacity, within {FLOW_MOVE_GAIN_FLOOR:.2%}-{FLOW_MOVE_GAIN:.0%} (routing/flow_move.py).")] = 0.75,
    move_mode: Annotated[str, typer.Option(help="How a move loads its new layers: beside (keep serving the old ones meanwhile; needs memory for both), in-place (free the old ones first), or auto (beside when free memory holds the new ones).")] = "auto",
    pre_read: Annotated[bool, typer.Option(help="Before a self-placing peer makes a move its periodic balance check finds (not one answering a gap or a thin layer), read the new layers' weight files into host memory (the page cache), serving on and announcing nothing meanwhile, then decide again on the swarm of then; a move inside what was read loads from memory: on an H100 host 0.23 s per 70B layer against 1.1 s from disk, so the layers it leaves are weaker for a fifth as long. A crash notice stops the read (gaps come first). Skipped when the new layers include one no GPU peer serves, when they exceed half the free host memory, or when their files are not on disk yet. Off by default: in the simulator it makes 12-22% fewer moves, even throughput at 200 peers and 1.2 points less at 2,000 (docs/balancing.md).")] = False,
    prefetch: Annotated[bool, typer.Option(help="For a Hub --model on a self-placing peer (or standby): once serving, download every layer's weight files into the HF cache in the background, when its disk has 1.5x the checkpoint's size free, so later moves load from disk instead of the network (a move's load is a window in which the swarm is weaker). Off: each move downloads its own layers.")] = True,
    standby: Annotated[bool, typer.Option("--standby", help="Serve as a standby: a slow safety net (e.g. with --device cpu and host memory) that places itself on the layers only one other peer serves and moves as those change. Clients route through it only when that peer is gone, so a crash leaves slow layers instead of a gap; other peers' balancing ignores it. Self-placing: not with --layers.")] = False,
    stream_weights: Annotated[bool, typer.Option("--stream-weights", help="With --device cuda: keep the weights in (pinned) host memory and copy them to the GPU a layer at a time at every step, so only two layers' weights and the KV cache take GPU memory. A step then costs the copy of its layers' weights, about constant in the batch (an int8 70B layer: 16-20 ms at 1-256 sequences on an H200). Meant for a --standby on a GPU whose memory its own peer holds: the sessions it carries while it is some layer's only server go on at the copy's speed. While it streams, the machine's own peer slows (docs/performance.md). Use --quant int8 to halve the bytes copied.")] = False,
    initial_peers: InitialPeers = None,
    model_name: Annotated[str | None, typer.Option(help="Name of the model in the DHT. Default: the Hub repo id, or the checkpoint folder's name.")] = None,
    host_maddrs: HostMaddrs = None,
    announce_maddrs: AnnounceMaddrs = None,
    public_ip: PublicIp = None,
    port: Port = None,
    no_relay: NoRelay = False,
    device: Annotated[str, typer.Option(help="cpu or cuda (cuda:N).")] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    quant: Annotated[str, typer.Option(help="Weight-only quantization while loading: none, int8 (per channel) or int4 (group-wise); fits 2x / ~3.5x more layers. See --dry-run.")] = "none",
    quant_group_size: Annotated[int, typer.Option(help="Group size of int4 quantization: 128, 64 or 32 (32: most accurate, no fast GPU kernel yet).")] = 128,
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
    drain_timeout: Annotated[float, typer.Option(help="On the first Ctrl-C / SIGTERM, announce DRAINING and keep serving until other peers cover our layers (and, where our layers would be left thin, while a replacement loads there), at most this many seconds (a second signal stops at once). 0: stop at once.")] = 120.0,
    max_sessions: Annotated[int, typer.Option(help="Open sessions at most, all clients together.")] = 256,
    max_sessions_per_remote: Annotated[int, typer.Option(help="Open sessions at most per client peer.")] = 64,
    max_length: Annotated[int, typer.Option(help="Tokens at most per sequence of a session.")] = 8192,
    idle_timeout: Annotated[float, typer.Option(help="Seconds without a step before a session is closed.")] = 300.0,
    max_steps_per_second: Annotated[float, typer.Option(help="Steps (and forward passes) per second at most from one client, with bursts of twice that; 0: unlimited.")] = 2000.0,
    max_tensor_elements: Annotated[int, typer.Option(help="Elements at most in one received tensor (checked before anything is allocated).")] = 64 * 2**20,
    max_frame_mb: Annotated[int, typer.Option(help="Largest frame accepted, in MiB (default: the largest allowed tensor plus the message's other fields).")] = ServingLimits().max_frame_bytes // 2**20,
    max_client_pages_fraction: Annotated[float, typer.Option(help="Share of the KV cache one client may hold at once (its sessions and forward passes together), so one long prompt cannot leave other clients 'busy'. 1: no per-client cap.")] = 0.5,
    share_prefix_across_clients: Annotated[bool, typer.Option("--share-prefix-across-clients", help="Let clients reuse each other's cached prompt prefixes. Only for private swarms whose members all trust each other: a client could plant wrong KV pages under another's prompt. Default: each client shares only with itself.")] = False,
    num_threads: Annotated[int, typer.Option(help="Torch CPU threads. 0: 4 with --device cuda (a GPU peer's CPU work is small, and one thread per core would crowd out other processes on the machine, such as a standby beside it or a peer per GPU), else torch's default of one per core.")] = 0,
    no_cuda_graphs: Annotated[bool, typer.Option("--no-cuda-graphs", help="On CUDA, run decode steps eagerly instead of replaying captured CUDA graphs (slower; for debugging and comparison).")] = False,
    faulty: Annotated[float, typer.Option(hidden=True, help="TEST ONLY: add noise of this std to outputs.")] = 0.0,
    faulty_probability: Annotated[float, typer.Option(hidden=True, help="TEST ONLY: with --faulty, lie on this fraction of results.")] = 1.0,
    log_level: Annotated[str, typer.Option(help="Logging level on stderr.")] = "info",
) -> None:
    """Serve layers of a model to the swarm until Ctrl-C / SIGTERM (the first one drains, see --drain-timeout)."""
    setup_logging(log_level)
    load_swarm_key(swarm_key)  # a bad key file is reported now, not after loading weights
    check_identity(identity)
    layer_range = check_serve_options(
        layers=layers, num_layers=num_layers, standby=standby, watch_period=watch_period,
        balance_quality=balance_quality, move_mode=move_mode, announce_ttl=announce_ttl, quant=quant,
        quant_group_size=quant_group_size, dtype=dtype, drain_timeout=drain_timeout, cache_fraction=cache_fraction,
        max_client_pages_fraction=max_client_pages_fraction)
    addresses = check_addresses(initial_peers, host_maddrs, announce_maddrs, public_ip, port)
    check_device(device)
    if stream_weights and not device.startswith("cuda"):
        raise typer.BadParameter("streams weights from host memory to a GPU: add --device cuda (on a CPU the "
                                 "weights are in host memory already)", param_hint="--stream-weights")
    # A fixed range's files are fetched now, before joining; a self-placing peer's once its range is chosen.
    source = resolve_checked(model, revision, layer_range, num_layers, weights=not dry_run and layer_range is not None)
    quant, quant_group_size = checkpoint_quant(source.path, quant, quant_group_size)  # a quantized --model fixes them
    config = PeerConfig(
        model_path=source.path,
        layers=layer_range,
        num_layers=num_layers,
        balance_period=balance_period,
        watch_period=watch_period,
        balance_quality=balance_quality,
        move_mode=move_mode,
        pre_read=pre_read,
        standby=standby,
        stream_weights=stream_weights,
        model_name=model_name or source.default_name,
        model_repo=source.repo_id,
        revision=revision,
        prefetch=prefetch,
        initial_peers=tuple(initial_peers or ()),
        host_maddrs=addresses.host,
        announce_maddrs=addresses.announce,
        use_relay=not no_relay,
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
        from hivemind.p2p import P2PDaemonError

        from peer.server import PeerServer
        from shards.errors import CheckpointError
        from swarm.reachability import join_advice

        server = PeerServer(await with_reachability(config))
        try:
            try:
                await server.start()
            except CheckpointError as e:
                raise StartupError(str(e)) from None
            except (P2PDaemonError, TimeoutError) as e:
                raise StartupError(join_failure(e, config.initial_peers)) from None
            if not config.initial_peers:
                for addr in server.visible_maddrs():
                    say(addr)
            if server.config.relayed:  # our own addresses are private: nobody could use them
                logger.info("others join with the --initial-peers line of a directly reachable member")
            else:
                logger.info("%s", join_advice(server.visible_maddrs()))
            say(f"online {server.peer_id} {server.layers}")
            await stop.wait()
            if drain_timeout > 0:
                await drain_until_covered_or_signal(server, drain_timeout, stop)
        finally:
            await server.stop()

    _run_until_signal(main)


async def drain_until_covered_or_signal(server, timeout: float, stop: asyncio.Event) -> None:
    """Graceful departure (peer/drain.py), cut short by a second Ctrl-C / SIGTERM."""
    stop.clear()
    logger.info("leaving gracefully; Ctrl-C / SIGTERM again to stop at once")
    drain = asyncio.ensure_future(server.drain(timeout))
    second = asyncio.ensure_future(stop.wait())
    await asyncio.wait({drain, second}, return_when=asyncio.FIRST_COMPLETED)
    for task in (drain, second):
        task.cancel()
    outcome = "interrupted"
    if drain.done() and not drain.cancelled():
        if drain.exception() is not None:
            logger.warning("draining failed (%s); stopping now", drain.exception())
            outcome = "failed"
        else:
            outcome = drain.result()
    say(f"drained {outcome}")


async def with_reachability(config: PeerConfig) -> PeerConfig:
    """Ask a swarm member to dial us back; when nobody can, serve relayed (see swarm/reachability.py).

    Skipped for the first node of a swarm (nobody to ask), with --no-relay, and when we listen on
    loopback only (a test or single-machine swarm: nobody outside could reach us anyway).
    """
    from dataclasses import replace

    from hivemind.p2p import P2PDaemonError

    from swarm.reachability import (
        RELAY_CANDIDATES_FOR_QUICK_START,
        SLOW_RELAY_ADVICE,
        UNREACHABLE_ADVICE,
        check_reachable,
        is_loopback,
    )

    if not config.use_relay or not config.initial_peers:
        return config
    if not config.announce_maddrs and all(is_loopback(m) for m in config.host_maddrs):
        return config
    try:
        reachable = await check_reachable(config.initial_peers, config.host_maddrs, config.announce_maddrs)
    except (P2PDaemonError, TimeoutError) as e:
        raise StartupError(join_failure(e, config.initial_peers)) from None
    if reachable is None:
        logger.info("no swarm member could check whether others can dial us; assuming they can")
    if reachable is not False:
        return config
    addrs = ", ".join(config.announce_maddrs or config.host_maddrs)
    logger.warning(UNREACHABLE_ADVICE.format(addrs=addrs))
    if len(config.initial_peers) < RELAY_CANDIDATES_FOR_QUICK_START:
        logger.warning(SLOW_RELAY_ADVICE.format(n=len(config.initial_peers)))
    return replace(config, relayed=True)


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


app.command()(quantize)  # swarm-peer quantize: peer/quantize_cli.py
app.command()(drain)  # swarm-peer drain: peer/drain_cli.py


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
