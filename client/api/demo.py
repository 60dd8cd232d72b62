"""`make chat`: a local SmolLM2 swarm with the gateway in front; prints the chat page's address.

Prepares SmolLM2-135M-Instruct (once), starts a bootstrap DHT, two peers (layers 0:15 and 15:30)
and `swarm-api` on 127.0.0.1, then waits until Ctrl-C or SIGTERM and stops every process it started.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path


def banner(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m", file=sys.stderr, flush=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="Port of the gateway (API and chat page).")
    parser.add_argument("--keep-logs", action="store_true", help="Keep the processes' logs and print where.")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)  # a supervisor's stop works like Ctrl-C

    from client.api.process import GatewayProcess
    from client.local_swarm import LocalSwarm
    from shards.demo_model import prepare_demo_model

    banner("preparing SmolLM2-135M-Instruct (converted once, then cached)")
    model_path = prepare_demo_model()
    log_dir = Path(tempfile.mkdtemp(prefix="layerswarm-chat-"))
    gateway = None
    with LocalSwarm(log_dir, {"OMP_NUM_THREADS": "1"}) as swarm:
        try:
            banner("starting a bootstrap DHT, two peers (layers 0:15 and 15:30) and swarm-api on 127.0.0.1")
            swarm.start_dht()
            peers = [swarm.start_peer(model_path, r, "--public-name", f"chat-{r}", wait=False) for r in ("0:15", "15:30")]
            gateway = GatewayProcess(model_path, swarm.initial_peers[0], log_dir / "api.log", port=args.port)
            for peer in peers:
                swarm.wait_online(peer)
            name = model_path.name
            banner(f"chat page: {gateway.url}/   (Ctrl-C stops everything)")
            print(f"    OpenAI API: {gateway.url}/v1  model: {name}\n"
                  f"    curl {gateway.url}/v1/chat/completions -H 'Content-Type: application/json' "
                  f"-d '{{\"model\": \"{name}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hi!\"}}]}}'",
                  file=sys.stderr, flush=True)
            threading.Event().wait()
            return 0
        except KeyboardInterrupt:
            banner("stopping the gateway and the swarm")
            return 130
        finally:
            if gateway is not None:
                gateway.stop()
            swarm.close(graceful=True)
            if args.keep_logs:
                print(f"    logs: {log_dir}", file=sys.stderr)
            else:
                shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
