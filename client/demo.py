"""`make demo`: a whole swarm on this machine, answering a prompt with SmolLM2-135M-Instruct.

Prepares the model (once), starts a bootstrap DHT, two peers (layers 0:15 and 15:30) and the
monitor page on 127.0.0.1, streams the answer to the terminal with timings, then stops every
process it started, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from client.demo_swarm import (
    banner,
    demo_log_dir,
    local_demo_swarm,
    start_demo_peers,
    stop_like_ctrl_c_on_sigterm,
)
from swarm.launcher import launched_env

DEFAULT_PROMPT = "Explain in three sentences why the sky is blue."


def start_monitor(initial_peer: str, port: int, log_dir: Path) -> subprocess.Popen:
    """The monitor page (`swarm-monitor`), from this interpreter so no PATH lookup is needed."""
    return subprocess.Popen(
        [sys.executable, "-m", "client.monitor.cli", "--initial-peers", initial_peer, "--port", str(port),
         "--refresh", "2"],
        stdout=subprocess.DEVNULL, stderr=open(log_dir / "monitor.log", "w"),  # noqa: SIM115
        stdin=subprocess.DEVNULL, start_new_session=True, env=dict(os.environ, **launched_env()),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT, help="What to ask the model.")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="Tokens to generate at most.")
    parser.add_argument("--monitor-port", type=int, default=8080, help="Port of the monitor page.")
    parser.add_argument("--keep-logs", action="store_true", help="Keep the processes' logs and print where.")
    parser.add_argument("--stay", action="store_true",
                        help="Keep the swarm and the monitor page running after the answer, until Ctrl-C.")
    args = parser.parse_args()
    stop_like_ctrl_c_on_sigterm()

    from client import DistributedModel
    from shards.demo_model import prepare_demo_model

    banner("preparing SmolLM2-135M-Instruct (converted once, then cached)")
    model_path = prepare_demo_model()
    monitor = None
    started = time.perf_counter()
    with demo_log_dir("layerswarm-demo-", args.keep_logs) as log_dir, local_demo_swarm(log_dir) as swarm:
        try:
            banner("starting a bootstrap DHT and two peers (layers 0:15 and 15:30) on 127.0.0.1")
            peers = start_demo_peers(swarm, model_path, "demo")
            for peer in peers:
                swarm.wait_online(peer)
                print(f"    peer {peer.peer_id[-8:]} online", file=sys.stderr)
            monitor = start_monitor(swarm.initial_peers[0], args.monitor_port, log_dir)
            print(f"    monitor page: http://127.0.0.1:{args.monitor_port}/ (while the demo runs)", file=sys.stderr)
            print(f"    swarm ready in {time.perf_counter() - started:.1f} s; bootstrap peer: "
                  f"{swarm.initial_peers[0]}", file=sys.stderr)
            banner(f"asking: {args.prompt}")
            with DistributedModel.from_pretrained(model_path, swarm.initial_peers) as model:
                from transformers import TextStreamer

                ids = model.tokenizer.apply_chat_template(
                    [{"role": "user", "content": args.prompt}], add_generation_prompt=True, return_tensors="pt"
                )
                ids = ids if hasattr(ids, "shape") else ids["input_ids"]
                t0 = time.perf_counter()
                out = model.generate(ids, max_new_tokens=args.max_new_tokens,
                                     streamer=TextStreamer(model.tokenizer, skip_prompt=True, skip_special_tokens=True))
                elapsed = time.perf_counter() - t0
                new = out.shape[1] - ids.shape[1]
                route = " -> ".join(f"{h.peer_id[-8:]}[{h.layers}]" for h in model.last_session.hops)
            banner(f"{new} tokens in {elapsed:.2f} s ({elapsed / max(new, 1) * 1000:.0f} ms/token, "
                   f"prompt of {ids.shape[1]} tokens included)")
            if route:
                print(f"    route: {route}", file=sys.stderr)
            if args.stay:
                banner(f"swarm running; monitor at http://127.0.0.1:{args.monitor_port}/ ; Ctrl-C to stop")
                threading.Event().wait()
            return 0
        except KeyboardInterrupt:
            banner("interrupted; stopping the swarm")
            return 130
        finally:
            if monitor is not None:
                monitor.terminate()
                try:
                    monitor.wait(5)
                except subprocess.TimeoutExpired:
                    monitor.kill()
            swarm.close(graceful=True)


if __name__ == "__main__":
    sys.exit(main())
