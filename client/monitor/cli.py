"""`swarm-monitor`: join the DHT as a client-only node and serve the swarm's health over HTTP.

stdout carries one machine-readable line, `monitor: http://HOST:PORT/`, once the page is served
(tests and `make demo` wait for it; with --port 0 it names the port the OS picked). Logs go to
stderr. SIGTERM and Ctrl-C stop it cleanly with exit code 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from swarm.launcher import exit_with_launcher

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
logger = logging.getLogger("swarm-monitor")


class JoinError(RuntimeError):
    """The DHT could not be joined at start (no initial peer answered): nothing to monitor yet."""


async def serve(
    initial_peers: list[str], host: str, port: int, refresh: float, rpc_timeout: float, stale_after: float,
    swarm_key: Path | None = None,
) -> None:
    from aiohttp import web

    from client.monitor.app import make_app
    from client.monitor.collector import Collector, probe_info
    from client.web_site import start_site
    from swarm.auth import SwarmKey
    from swarm.dht import SwarmNode

    key = SwarmKey.load(swarm_key) if swarm_key else None  # a private swarm: read and probe as a member
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    # Starting the DHT blocks (it spawns a child process and bootstraps): keep the loop free.
    try:
        node = await loop.run_in_executor(None, lambda: SwarmNode(initial_peers=initial_peers, client_mode=True,
                                                                          swarm_key=key))
    except Exception as e:
        raise JoinError(f"cannot join the DHT via {', '.join(initial_peers)}: {e}") from None
    p2p = None
    runner = None
    task = None
    try:
        p2p = await node.replicate_p2p()  # bound to this loop, where the probes run
        collector = Collector(node, lambda pid: probe_info(p2p, pid, rpc_timeout, key), refresh, rpc_timeout)
        runner = web.AppRunner(make_app(collector, stale_after), access_log=None)
        await runner.setup()
        print(f"monitor: {await start_site(runner, host, port)}", flush=True)
        logger.info("monitor node %s joined via %s", node.peer_id, ", ".join(initial_peers))
        task = asyncio.create_task(collector.run())
        await stop.wait()
        logger.info("stopping")
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if runner is not None:
            await runner.cleanup()
        if p2p is not None:
            try:
                await asyncio.wait_for(p2p.shutdown(), 5)
            except Exception:
                logger.debug("p2p replica shutdown failed", exc_info=True)
        await loop.run_in_executor(None, node.shutdown)


@app.command(help="Serve a health page, JSON state and Prometheus metrics for a layerswarm swarm.")
def main(
    initial_peers: Annotated[
        list[str],
        typer.Option("--initial-peers", metavar="MADDR", help="Multiaddr of a DHT node of the swarm, e.g. /ip4/1.2.3.4/tcp/31337/p2p/12D3Koo... (repeatable; at least one)."),
    ],
    host: Annotated[str, typer.Option(metavar="HOST", help="Address to serve HTTP on. 127.0.0.1 keeps the page local; 0.0.0.0 makes it public.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="PORT", help="TCP port for HTTP (0: any free port, printed on stdout).", min=0, max=65535)] = 8080,
    refresh: Annotated[float, typer.Option(metavar="SECONDS", help="Seconds between two reads of the DHT and probes of every peer; the page refreshes at the same pace.", min=0.5)] = 10.0,
    rpc_timeout: Annotated[float, typer.Option(metavar="SECONDS", help="Seconds to wait for a peer's info answer (and for each DHT read) before calling it unreachable.", min=0.1)] = 5.0,
    stale_after: Annotated[float | None, typer.Option(metavar="SECONDS", help="Mark the data stale when the last good refresh is older than this many seconds. Default: 3 x refresh + rpc-timeout.")] = None,
    swarm_key: Annotated[Path | None, typer.Option("--swarm-key", metavar="FILE", help="Secret file of a private swarm (from `swarm-peer keygen`); without it a private swarm looks empty.")] = None,
    log_level: Annotated[str, typer.Option(metavar="LEVEL", help="Logging level on stderr: debug, info, warning or error.")] = "info",
) -> None:
    exit_with_launcher()  # started by the demo or a test: stop when it dies (swarm/launcher.py)
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter(f"{log_level!r}: choose debug, info, warning or error", param_hint="--log-level")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not initial_peers:
        raise typer.BadParameter("give at least one multiaddr", param_hint="--initial-peers")
    stale = stale_after if stale_after is not None else 3 * refresh + rpc_timeout
    try:
        asyncio.run(serve(initial_peers, host, port, refresh, rpc_timeout, stale, swarm_key))
    except (JoinError, ValueError) as e:  # ValueError: a bad --swarm-key file (SwarmKeyError)
        logger.error("%s", e)
        raise typer.Exit(2) from None
    except OSError as e:  # port in use, bad host: a message, not a traceback
        logger.error("cannot serve on %s:%s: %s", host, port, e)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        pass


if __name__ == "__main__":
    app()
