"""The peer process: serves a contiguous range of a model's layers to the swarm.

- `config.py`: `PeerConfig`, `ServingLimits` (what a peer is told at start; no I/O).
- `server.py`: `PeerServer`, the process's life: join DHT, build the engine (a self-placing peer's
  growing as its layers arrive), announce, stop cleanly.
- `moves.py`: `Moves` (a mixin of `PeerServer`): `migrate` to another range, beside or in place,
  serving each layer as it arrives; `pre_read`, a range's weights into the page cache beforehand.
- `engine.py`: `ServingEngine`, the served model state (shard, KV cache, page outputs, CUDA graphs)
  and its one `run_batch` (decode-only batches on CUDA replay graphs; the rest runs eagerly).
- `handler.py`: the `layerswarm/v1` stream protocol (info, forward, open, step, push, truncate, close,
  view, crash_notice).
- `sessions.py`: peer-side sessions and their KV page tables; session limits and admission.
- `prefix_cache.py`, `page_outputs.py`: prefix sharing (page hashes, LRU of cached pages, stored outputs).
- `rate_limit.py`: steps per second per client.
- `balancer.py`, `memory.py`: choosing and moving the served layers (given a `Placement` of callables,
  not the server; a periodic move's layers read into memory first; a `--standby` peer follows the
  layers one crash would leave dark); how many layers fit.
- `prefetch.py`: a self-placing peer of a Hub model fetches every layer's files in the background, so
  its moves load from disk (until then it refills last: balancer.py react_delay).
- `scheduler.py`: continuous batching of many sessions' steps into one forward pass.
- `push.py`: server-to-server push of a session's output to the next hop.
- `view.py`: the `view` request: the records this peer sees for a model, as their owners signed them
  (bounded, cached DHT reads).
- `crash_watch.py`: `CrashWatch`: the view balancing and draining decide on, less the peers clients
  reported unreachable and that fail our own probe (a crash seen in seconds, not at record expiry).
- `crash_notices.py`: `CrashNotices`: a client's or peer's notice of a crash wakes the watch at once and
  is passed on to a few more peers (rate limited; every peer still probes for itself).
- `drain.py`: graceful departure: after announcing DRAINING, wait until other peers cover our layers.
- `drain_cli.py`: `swarm-peer drain --pid`: signal a running peer to leave gracefully, wait until it exits.
- `cli.py`: the `swarm-peer` command (`dht`, `serve`, `keygen`, `generate`, `quantize`, `drain`).
- `cli_checks.py`: its option checks, done before anything starts (one line per problem, exit code 2).
- `quantize_cli.py`: `swarm-peer quantize` (GPTQ int4 / int8 checkpoint writer) and serve's check of it.
"""
