"""The client: generate text with a model whose layers are served by swarm peers.

- `model.py`: `DistributedModel` (from_pretrained, generate, __call__ for logits, chat).
- `generation.py`: the token loop; `sampling.py`: next-token choice (transformers' processors).
- `session.py`: `InferenceSession`, steps through a route, failover with replay.
- `hop.py`: `HopSession`, one peer's part of a session and the inputs it was sent.
- `forward.py`: stateless forward passes (scoring).
- `stall.py`: a hop silent for a while is probed; a vanished host fails over in seconds.
- `swarm_client.py`: DHT node, P2P streams, view cache, bans and route planning.
- `measured.py`: per-peer throughput the client measured, which caps what peers announce in routing.
- `loop.py`: the private event loop thread behind the synchronous API.
- `config.py`: `ClientConfig`.
- `errors.py`: `SwarmError` and which failures mean "route around this peer".
- `verify.py`: catching peers that return wrong results (ClientConfig.verify).
- `local_swarm.py`: starting real peer processes on this machine (demo, benchmarks, tests).
- `monitor/`: the `swarm-monitor` health page.
- `api/`: `swarm-api`, the OpenAI-compatible HTTP gateway and chat page (`make chat`).
- `web_site.py`: `start_site`, where `swarm-api` and `swarm-monitor` listen (the port bound for `--port 0`).
- `cli.py`: `swarm-peer generate`; `demo.py`: `make demo`; `demo_swarm.py`: the two-peer swarm
  `make demo` and `make chat` (`api/demo.py`) both start.
"""

from typing import Any

# Loaded on first use (PEP 562): `swarm-monitor` and `make demo`'s launcher import client.*
# submodules without paying for torch and transformers.
_LAZY = {
    "ClientConfig": "client.config",
    "DistributedModel": "client.model",
    "InferenceSession": "client.session",
    "SwarmError": "client.errors",
}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
