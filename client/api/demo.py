"""`make chat`: a local SmolLM2 swarm with the gateway in front; prints the chat page's address.

Prepares SmolLM2-135M-Instruct (once), starts a bootstrap DHT, two peers (layers 0:15 and 15:30)
and `swarm-api` on 127.0.0.1, then waits until Ctrl-C or SIGTERM and stops every process it started.
"""

from __future__ import annotations

import argparse
import sys
import threading

from client.demo_swarm import (
    banner,
    demo_log_dir,
    local_demo_swarm,
    start_demo_peers,
    stop_like_ctrl_c_on_sigterm,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="Port of the gateway (API and chat page).")
    parser.add_argument("--keep-logs", action="store_true", help="Keep the processes' logs and print where.")
    args = parser.parse_args()
    stop_like_ctrl_c_on_sigterm()

    from client.api.process import GatewayProcess
    from shards.demo_model import prepare_demo_model

    banner("preparing SmolLM2-135M-Instruct (converted once, then cached)")
    model_path = prepare_demo_model()
    gateway = None
    with demo_log_dir("layerswarm-chat-", args.keep_logs) as log_dir, local_demo_swarm(log_dir) as swarm:
        try:
            banner("starting a bootstrap DHT, two peers (layers 0:15 and 15:30) and swarm-api on 127.0.0.1")
            peers = start_demo_peers(swarm, model_path, "chat")
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


if __name__ == "__main__":
    sys.exit(main())
