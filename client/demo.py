"""`make demo`: a whole swarm on this machine, answering a prompt with SmolLM2-135M-Instruct.

Prepares the model (once), starts a bootstrap DHT, two peers (layers 0:15 and 15:30) and the
monitor page on 127.0.0.1, streams the answer to the terminal with timings, then stops every
process it started, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

DEFAULT_PROMPT = "Explain in three sentences why the sky is blue."


def banner(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m", file=sys.stderr, flush=True)


def start_monitor(initial_peer: str, port: int, log_dir: Path) -> subprocess.Popen:
    """The monitor page (`swarm-monitor`), from this interpreter so no PATH lookup is needed."""
    return subprocess.Popen(
        [sys.executable, "-m", "client.monitor.cli", "--initial-peers", initial_peer, "--port", str(port),
         "--refresh", "2"],
        stdout=subprocess.DEVNULL, stderr=open(log_dir / "monitor.log", "w"),  # noqa: SIM115
        stdin=subprocess.DEVNULL, start_new_session=True,
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT, help="What to ask the model.")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="Tokens to generate at most.")
    parser.add_argument("--monitor-port", type=int, default=8080, help="Port of the monitor page.")
    parser.add_argument("--keep-logs", action="store_true", help="Keep the processes' logs and print where.")
    parser.add_argument("--stay", action="store_true",
                        help="Keep the swarm and the monitor page running after the answer, until Ctrl-C.")
    args = parser.parse_args()
    # SIGTERM (a supervisor, `kill`, an IDE's stop button) stops the swarm exactly as Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)

    from client import DistributedModel
    from client.local_swarm import LocalSwarm
    from shards.demo_model import prepare_demo_model

    banner("preparing SmolLM2-135M-Instruct (converted once, then cached)")
    model_path = prepare_demo_model()
    log_dir = Path(tempfile.mkdtemp(prefix="layerswarm-demo-"))
    monitor = None
    started = time.perf_counter()
    # One torch thread per peer: the two peers share this machine's cores instead of fighting over them.
    with LocalSwarm(log_dir, {"OMP_NUM_THREADS": "1"}) as swarm:
        try:
            banner("starting a bootstrap DHT and two peers (layers 0:15 and 15:30) on 127.0.0.1")
            swarm.start_dht()
            peers = [swarm.start_peer(model_path, r, "--public-name", f"demo-{r}", wait=False)
                     for r in ("0:15", "15:30")]
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
            if args.keep_logs:
                print(f"    logs: {log_dir}", file=sys.stderr)
            else:
                shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
