"""The peer process: serves a contiguous range of a model's layers to the swarm.

- `config.py`: `PeerConfig`, `ServingLimits` (what a peer is told at start; no I/O).
- `server.py`: `PeerServer`, the process's life: load shard, join DHT, announce, stop cleanly.
- `handler.py`: the `layerswarm/v1` stream protocol (info, forward, open, step, push, truncate, close).
- `sessions.py`: peer-side sessions and their KV page tables; session limits and admission.
- `prefix_cache.py`, `page_outputs.py`: prefix sharing (page hashes, LRU of cached pages, stored outputs).
- `rate_limit.py`: steps per second per client.
- `balancer.py`, `memory.py`: choosing and moving the served layers; how many layers fit.
- `scheduler.py`: continuous batching of many sessions' steps into one forward pass.
- `push.py`: server-to-server push of a session's output to the next hop.
- `view.py`: the `view` request: the records this peer sees for a model (bounded, cached DHT reads).
- `throughput.py`: the startup benchmark announced in the peer's record.
- `cli.py`: the `swarm-peer` command (`dht`, `serve`, `keygen`, `generate`).
"""
