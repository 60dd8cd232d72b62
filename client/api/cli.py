"""`swarm-api`: an OpenAI-compatible HTTP gateway (and chat page) in front of a layerswarm swarm.

stdout carries one machine-readable line, `api: http://HOST:PORT/`, once requests are served
(tests and `make chat` wait for it; with --port 0 it names the port the OS picked). Logs go to
stderr. SIGTERM and Ctrl-C stop it cleanly with exit code 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from swarm.launcher import exit_with_launcher

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
logger = logging.getLogger("swarm-api")


def read_api_keys(path: Path) -> tuple[str, ...]:
    """One key per non-empty line; '#' starts a comment line."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read --api-key-file {path}: {e}") from None
    keys = tuple(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise ValueError(f"--api-key-file {path} holds no key (one key per line)")
    return keys


def load_model(model: str, initial_peers: list[str], model_name: str | None, swarm_key: Path | None,
               device: str | None, revision: str | None) -> Any:
    from client.model import DistributedModel

    return DistributedModel.from_pretrained(model, initial_peers, model_name=model_name, swarm_key=swarm_key,
                                            device=device, revision=revision)


async def serve(model: Any, host: str, port: int, api_keys: tuple[str, ...], max_running: int) -> None:
    from aiohttp import web

    from client.api.app import make_app
    from client.api.engine import Engine
    from client.api.metrics import ApiMetrics
    from client.web_site import start_site

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    metrics = ApiMetrics(model.model_name)
    engine = Engine(model, max_running, metrics)
    # handler_cancellation: a client that disconnects cancels its handler, which stops its generation.
    runner = web.AppRunner(make_app(engine, metrics, api_keys), access_log=None, handler_cancellation=True)
    try:
        await runner.setup()
        url = await start_site(runner, host, port)
        print(f"api: {url}", flush=True)
        logger.info("serving %s at %s (OpenAI API under /v1/, chat page at /)", model.model_name, url)
        await stop.wait()
        logger.info("stopping")
    finally:
        await runner.cleanup()
        engine.close()


@app.command(help="Serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models) and a "
                  "chat page for a model served by a layerswarm swarm.")
def main(
    model: Annotated[str, typer.Option("--model", metavar="PATH|REPO", help="Local checkpoint folder or Hugging Face repo id of the model: the gateway needs its tokenizer, chat template, embeddings and LM head (a repo's decoder layers are never downloaded).")],
    initial_peers: Annotated[list[str], typer.Option("--initial-peers", metavar="MADDR", help="Multiaddr of any peer of the swarm, e.g. /ip4/1.2.3.4/tcp/31337/p2p/12D3Koo... (repeatable; at least one).")],
    host: Annotated[str, typer.Option(metavar="HOST", help="Address to serve HTTP on. 127.0.0.1 keeps it local; 0.0.0.0 makes it public (then use --api-key-file).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="PORT", help="TCP port for HTTP (0: any free port, printed on stdout).", min=0, max=65535)] = 8000,
    swarm_key: Annotated[Path | None, typer.Option("--swarm-key", metavar="FILE", help="Secret file of a private swarm (from `swarm-peer keygen`).")] = None,
    api_key_file: Annotated[Path | None, typer.Option("--api-key-file", metavar="FILE", help="File with the API keys clients must send as 'Authorization: Bearer KEY' (one per line). Without it /v1/ is open to anyone who can reach the port.")] = None,
    device: Annotated[str | None, typer.Option(metavar="DEVICE", help="Where the embeddings, LM head and sampling run: cpu, cuda or cuda:N. Default: cuda when a GPU is present, else cpu.")] = None,
    model_name: Annotated[str | None, typer.Option(metavar="NAME", help="Name of the model in the DHT, also its id in the API. Default: the repo id, or the checkpoint folder's name.")] = None,
    revision: Annotated[str | None, typer.Option(metavar="REV", help="With a Hub repo id: the branch, tag or commit to use (token from HF_TOKEN).")] = None,
    max_running: Annotated[int, typer.Option(metavar="N", help="Generations running at once (each its own session on the peers); more requests wait in line.", min=1, max=1024)] = 64,
    log_level: Annotated[str, typer.Option(metavar="LEVEL", help="Logging level on stderr: debug, info, warning or error.")] = "info",
) -> None:
    exit_with_launcher()  # started by make chat, a benchmark or a test: stop when it dies (swarm/launcher.py)
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter(f"{log_level!r}: choose debug, info, warning or error", param_hint="--log-level")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not initial_peers:
        raise typer.BadParameter("give at least one multiaddr", param_hint="--initial-peers")
    try:
        api_keys = read_api_keys(api_key_file) if api_key_file else ()
        logger.info("joining the swarm via %s", ", ".join(initial_peers))
        lm = load_model(model, initial_peers, model_name, swarm_key, device, revision)
    except (ValueError, FileNotFoundError, TypeError) as e:  # bad folder, key file, device...
        logger.error("%s", e)
        raise typer.Exit(2) from None
    except Exception as e:  # the DHT could not be joined
        logger.error("cannot join the swarm via %s: %s", ", ".join(initial_peers), e)
        raise typer.Exit(2) from None
    try:
        asyncio.run(serve(lm, host, port, api_keys, max_running))
    except ValueError as e:  # a checkpoint without a tokenizer
        logger.error("%s", e)
        raise typer.Exit(2) from None
    except OSError as e:  # port in use, bad host: a message, not a traceback
        logger.error("cannot serve on %s:%s: %s", host, port, e)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass
    finally:
        lm.close()


if __name__ == "__main__":
    app()
