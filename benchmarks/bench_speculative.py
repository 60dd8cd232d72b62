"""Plain greedy vs prompt-lookup speculative decoding through 3 peers over delayed links.

SmolLM2-135M-Instruct split 0:10 / 10:20 / 20:30 over three peers, each in its own network
namespace joined to the client's namespace by a link with 10 ms one-way delay
(benchmarks/netns_swarm.sh). Prompts: (a) summarise a passage (the answer copies phrases, so
prompt lookup drafts well), (b) open-ended text (little to copy). Reports tokens/s of each
mode, swarm steps, drafts proposed/accepted, and checks the outputs are identical.

    benchmarks/netns_swarm.sh 3 -- .venv/bin/python benchmarks/bench_speculative.py [--new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client import DistributedModel  # noqa: E402
from client.local_swarm import LocalSwarm, SwarmProcess  # noqa: E402
from shards.demo_model import prepare_demo_model  # noqa: E402
from swarm.launcher import launched_env  # noqa: E402

LAYERS = ["0:10", "10:20", "20:30"]
PASSAGE = (
    "The Great Barrier Reef is the world's largest coral reef system, composed of over 2,900 individual "
    "reefs and 900 islands stretching for over 2,300 kilometres over an area of approximately 344,400 "
    "square kilometres. The reef is located in the Coral Sea, off the coast of Queensland, Australia. "
    "The Great Barrier Reef can be seen from outer space and is the world's biggest single structure "
    "made by living organisms. This reef structure is composed of and built by billions of tiny "
    "organisms, known as coral polyps. It supports a wide diversity of life and was selected as a World "
    "Heritage Site in 1981. A large part of the reef is protected by the Great Barrier Reef Marine Park, "
    "which helps to limit the impact of human use, such as fishing and tourism. Other environmental "
    "pressures on the reef and its ecosystem include runoff, climate change accompanied by mass coral "
    "bleaching, dumping of dredging sludge and cyclic population outbreaks of the crown-of-thorns starfish."
)
PROMPTS = {
    "summarise": f"Summarize the following passage in a few sentences.\n\n{PASSAGE}",
    "open-ended": "Write a short story about a lighthouse keeper who finds a strange machine on the beach.",
}


def start_peer(swarm: LocalSwarm, ns: str, addr: str, model: Path, layers: str) -> SwarmProcess:
    """`ip netns exec NS python -m peer.cli serve ...` (ip execs python, so the pid is the peer's)."""
    log_path = swarm.log_dir / f"peer-{ns}.log"
    cmd = [
        "ip",
        "netns",
        "exec",
        ns,
        sys.executable,
        "-m",
        "peer.cli",
        "serve",
        "--model",
        str(model),
        "--layers",
        layers,
        "--host-maddrs",
        f"/ip4/{addr}/tcp/0",
        "--initial-peers",
        swarm.initial_peers[0],
        "--num-threads",
        "1",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=open(log_path, "w"),  # noqa: SIM115
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **launched_env()),
    )
    process = SwarmProcess(proc, log_path)
    threading.Thread(target=process._pump, daemon=True).start()
    swarm.processes.append(process)
    return process


def link_rtt_ms(ns: str, addr: str, rounds: int = 20) -> float:
    """Median TCP round trip (1 byte, TCP_NODELAY) from here to an echo server inside `ns`."""
    echo = (
        "import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "s.bind(('0.0.0.0',7999));s.listen()\nc,_=s.accept()\n"
        "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
        "while (d:=c.recv(65536)): c.sendall(d)"
    )
    server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", echo])
    try:
        for _ in range(100):
            try:
                conn = socket.create_connection((addr, 7999), timeout=5)
                break
            except OSError:
                time.sleep(0.1)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            conn.sendall(b"x")
            conn.recv(16)
            times.append((time.perf_counter() - t) * 1000)
        conn.close()
        return statistics.median(times)
    finally:
        server.kill()
        server.wait()


def run(model: DistributedModel, ids: torch.Tensor, new_tokens: int, speculative: str | None) -> dict:
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, speculative=speculative)
    s = model.last_stats
    return {
        "tokens": out[0, ids.shape[1] :].tolist(),
        "new_tokens": s.new_tokens,
        "steps": s.steps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "wall_s": s.wall_time,
        "tok_s": s.tokens_per_second,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per (prompt, mode); the median is reported"
    )
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results" / "bench_speculative.json"
    )
    args = parser.parse_args()
    if "LSW_PEER_NS" not in os.environ:
        raise SystemExit(
            "run me through benchmarks/netns_swarm.sh 3 -- .venv/bin/python benchmarks/bench_speculative.py"
        )
    namespaces, addrs = os.environ["LSW_PEER_NS"].split(), os.environ["LSW_PEER_ADDRS"].split()
    model_path = prepare_demo_model()
    rtts = {ns: round(link_rtt_ms(ns, addr), 2) for ns, addr in zip(namespaces, addrs)}
    print(f"link RTT (TCP, 1 byte), ms: {rtts}", flush=True)

    with LocalSwarm(Path(tempfile.mkdtemp(prefix="bench-spec-")), {"OMP_NUM_THREADS": "1"}) as swarm:
        dht = swarm.spawn(["dht", "--host-maddrs", f"/ip4/{os.environ['LSW_HUB_ADDR']}/tcp/0"], "dht")
        dht.wait_for_line("/")
        swarm.initial_peers = dht.maddrs[:1]
        peers = [
            start_peer(swarm, ns, addr, model_path, layers)
            for ns, addr, layers in zip(namespaces, addrs, LAYERS)
        ]
        for peer in peers:
            swarm.wait_online(peer)
        torch.set_num_threads(1)
        model = DistributedModel.from_pretrained(model_path, swarm.initial_peers)
        try:
            rows = []
            prompts = {
                name: model.tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
                )
                for name, text in PROMPTS.items()
            }
            prompts = {k: v if isinstance(v, torch.Tensor) else v["input_ids"] for k, v in prompts.items()}
            run(model, prompts["open-ended"][:, :8], 4, None)  # warm-up: connections, route, first steps
            for name, ids in prompts.items():
                # Modes alternate run by run, so drifting load from other processes hits both alike.
                runs: dict[str, list[dict]] = {"plain": [], "prompt_lookup": []}
                for _ in range(args.repeats):
                    for mode in runs:
                        runs[mode].append(run(model, ids, args.new_tokens, None if mode == "plain" else mode))
                outputs = [r["tokens"] for mode_runs in runs.values() for r in mode_runs]
                results = {}
                for mode, mode_runs in runs.items():  # the median run by tokens/s
                    median = sorted(mode_runs, key=lambda r: r["tok_s"])[len(mode_runs) // 2]
                    results[mode] = dict(median, tok_s_runs=[round(r["tok_s"], 2) for r in mode_runs])
                plain = results["plain"]
                identical = all(tokens == outputs[0] for tokens in outputs)  # every run of both modes
                for mode, r in results.items():
                    rows.append(
                        {
                            "prompt": name,
                            "mode": mode,
                            "prompt_tokens": ids.shape[1],
                            **{k: v for k, v in r.items() if k != "tokens"},
                            "speedup": r["tok_s"] / plain["tok_s"],
                            "identical_output": identical,
                            "text": model.tokenizer.decode(r["tokens"], skip_special_tokens=True),
                        }
                    )
        finally:
            model.close()

    header = f"{'prompt':<11} {'mode':<14} {'tokens':>6} {'steps':>5} {'drafted':>7} {'accepted':>8} {'wall s':>7} {'tok/s':>6} {'speedup':>7} identical"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['prompt']:<11} {r['mode']:<14} {r['new_tokens']:>6} {r['steps']:>5} {r['drafted']:>7} "
            f"{r['accepted']:>8} {r['wall_s']:>7.2f} {r['tok_s']:>6.2f} {r['speedup']:>6.2f}x {r['identical_output']}"
        )
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()}-core CPU, {platform.machine()}",
        "model": "SmolLM2-135M-Instruct float32",
        "layers": LAYERS,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "network": "3 peer namespaces, each joined to the client's namespace by a TAP "
        f"link with a userspace delay line of {os.environ.get('LSW_DELAY_MS', '10')} ms each way (no sch_netem "
        "in this kernel); see benchmarks/netns_swarm.sh",
        "link_rtt_ms": rtts,
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
