"""Benchmarks: scripts that measure, print a table and write JSON (never timed unit tests).

Serving, CPU and loopback:
- bench_shard_cpu.py        one Shard's decode step against transformers
- bench_peer_batching.py    one peer's throughput as concurrent sessions grow
- bench_swarm_latency.py    decode latency through 1-3 peers; bench_stream_rtt.py the bare stream round trip
- bench_step_breakdown.py   where a decode token's time goes in a real `swarm-peer serve`
- bench_client_modes.py     relay vs server-to-server push; bench_speculative.py prompt-lookup decoding
- bench_api.py              what the OpenAI-compatible gateway adds
- bench_layer_load.py       one layer's load from disk (what a move costs)
- bench_verify_catch.py     how often verification catches a quiet liar
- soak_peer.py              many sessions against one peer; its memory must not grow
- netns_swarm.sh            a private delayed network for the above

GPU (run on a CUDA machine, results in docs/performance.md): run_gpu.sh drives bench_gpu.py (one
peer), bench_gpu_swarm.py (peers end to end through the CLI and client) and bench_quant_kernels.py.

Balancing (docs/balancing.md):
- simulate_swarm.py         the churning swarm, balancing itself with routing/; sim_swarm_state.py
                            its peers and per-layer arrays, sim_report.py its result and table,
                            sim_trace.py its served max flow at every change (--trace)
- sim_dips.py               a trace's loss below its median, by the event that opened each dip (crashes also
                            by the crashed peer's size, and the part before the crash was seen)
- sim_seeds.py              several traced runs together: each one's share of the optimum, the mean with its
                            spread, and the paired differences against the same seeds under another rule
- sim_branches.py           a run forked every few minutes into branches under other rules (--branch), each
                            paired with the run over the same window: rules that act on a crash, judged finely
- sim_fragility.py          how much of the max flow one crash takes, against the profile placement
- sim_optimum.py            the optimum: a MILP for small swarms, a bracket (optimum_bracket: one-pass placements
                            climbed by window shifts below, the capped bound above) for large ones
- sim_bracket.py            that bracket per seed for the simulator's swarms
- sim_cluster.py            Helix-like clusters against the proven optimum
- sim_decisions.py          how long a placement decision and a route choice take at 1,000 peers
"""
