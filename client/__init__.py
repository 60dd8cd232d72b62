"""The client: generate text with a model whose layers are served by swarm peers.

- `model.py`: `DistributedModel` (from_pretrained, generate, __call__ for logits, chat).
- `generation.py`: the token loop; `sampling.py`: next-token choice (transformers' processors).
- `session.py`: `InferenceSession`, steps through a route, failover with replay.
- `hop.py`: `HopSession`, one peer's part of a session and the inputs it was sent.
- `forward.py`: stateless forward passes (scoring).
- `swarm_client.py`: DHT node, P2P streams, view cache, bans and route planning.
- `loop.py`: the private event loop thread behind the synchronous API.
- `config.py`: `ClientConfig`.
- `cli.py`: `swarm-peer generate`; `demo.py`: `make demo`.
"""

from client.config import ClientConfig
from client.model import DistributedModel
from client.errors import SwarmError
from client.session import InferenceSession

__all__ = ["ClientConfig", "DistributedModel", "InferenceSession", "SwarmError"]
