"""What `make demo` and `make chat` share: the two-peer SmolLM2 swarm they start, and how they stop.

Both prepare the demo model, start a bootstrap DHT and two peers (layers 0:15 and 15:30) on
127.0.0.1 with one torch thread each, and stop every process on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from client.local_swarm import LocalSwarm, SwarmProcess

DEMO_RANGES = ("0:15", "15:30")  # SmolLM2-135M has 30 layers: two peers, half each


def banner(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m", file=sys.stderr, flush=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_like_ctrl_c_on_sigterm() -> None:
    """SIGTERM (a supervisor, `kill`, an IDE's stop button) stops the demo exactly as Ctrl-C does."""
    signal.signal(signal.SIGTERM, _interrupt)


@contextmanager
def demo_log_dir(prefix: str, keep_logs: bool) -> Iterator[Path]:
    """A fresh folder for the processes' logs: printed at the end with `keep_logs`, else removed."""
    log_dir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield log_dir
    finally:
        if keep_logs:
            print(f"    logs: {log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)


def local_demo_swarm(log_dir: Path) -> LocalSwarm:
    # One torch thread per peer: the two peers share this machine's cores instead of fighting over them.
    return LocalSwarm(log_dir, {"OMP_NUM_THREADS": "1"})


def start_demo_peers(swarm: LocalSwarm, model_path: Path, name: str) -> list[SwarmProcess]:
    """The bootstrap DHT and the two peers, started without waiting (callers overlap their own start-up)."""
    swarm.start_dht()
    return [swarm.start_peer(model_path, r, "--public-name", f"{name}-{r}", wait=False) for r in DEMO_RANGES]
