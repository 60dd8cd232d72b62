"""Coverage-guided fuzzer (atheris / libFuzzer) for the wire decoder and the typed message schema.

Every input is one frame payload, decoded and parsed exactly as a peer does before acting on it
(`swarm.schema.parse_request`: every request type with its push chain, token ids and push
binding). Anything but a clean result or a ProtocolError is a bug (atheris stops and saves the
input). A request that parses must survive `to_wire` -> encode -> decode -> parse unchanged in
type. Allocation is bounded by the limits below (frames up to 1 MiB): a frame may never make us
build more.

    .venv/bin/python tests/fuzz/fuzz_wire.py tests/fuzz/corpus -runs=100000 -max_len=1048576
    .venv/bin/python tests/fuzz/fuzz_wire.py --make-corpus tests/fuzz/corpus   # rewrite the seeds
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

# Third-party packages our modules import are imported before instrumenting, so only our code is
# instrumented: instrumenting torch took minutes, and hivemind with its dependencies (scipy,
# numpy, cryptography, pydantic: pulled in through swarm's records) about 75 s, per run.
import cryptography  # noqa: F401
import hivemind  # noqa: F401
import msgpack  # noqa: F401
import numpy  # noqa: F401
import scipy  # noqa: F401
import torch  # noqa: F401

with atheris.instrument_imports():
    from swarm import messages as m
    from swarm.codec import Limits, decode_message, encode_message, encode_tensor
    from swarm.errors import ProtocolError
    from swarm.schema import parse_request

LIMITS = Limits(max_frame_bytes=1 << 20, max_tensor_elements=1 << 12)


def test_one_input(data: bytes) -> None:
    try:
        request = parse_request(decode_message(data, LIMITS), LIMITS)
    except ProtocolError:
        return
    again = parse_request(decode_message(encode_message(request.to_wire()), LIMITS), LIMITS)
    if type(again) is not type(request):
        raise AssertionError(f"{type(request).__name__} came back as {type(again).__name__}")


def make_corpus(folder: Path) -> None:
    """Seed inputs: one well-formed frame per request type."""
    hidden = encode_tensor(torch.zeros(2, 4))
    token = "t" * 16
    seeds = {
        "info": {"type": m.INFO},
        "open": {"type": m.OPEN, "session_id": "s", "max_length": 64, "batch": 1, "layers": [0, 2]},
        "open_bound": {"type": m.OPEN, "max_length": 64, "push_from": "QmPeer", "push_token": token},
        "step": {"type": m.STEP, "step_id": 1, "hidden": hidden, "new_tokens": [2], "positions": [0]},
        "step_chain": {"type": m.STEP, "step_id": 1, "hidden": hidden, "new_tokens": [1, 1], "positions": [0, 3],
                       "token_ids": [[5], [2**31 - 1]], "next": [["p2", "s2", token], ["p3", "s3", token]],
                       "push_from": "QmPeer", "push_token": token},
        "forward": {"type": m.FORWARD, "hidden": hidden, "new_tokens": [1, 1], "layers": [0, 1]},
        "push": {"type": m.PUSH, "session_id": "s", "push_token": token, "step_id": 1, "hidden": hidden,
                 "new_tokens": [2], "positions": [0], "token_ids": [[1, 2]], "next": [["peer", "s2", token]]},
        "truncate": {"type": m.TRUNCATE, "length": 3},
        "close": {"type": m.CLOSE},
        "view": {"type": m.VIEW, "model": "tiny"},
        "auth": {"type": m.AUTH, "proof": b"\x01" * 32},
        "bf16": {"type": m.STEP, "step_id": 1, "hidden": encode_tensor(torch.zeros(1, 4, dtype=torch.bfloat16)),
                 "new_tokens": [1], "positions": [5]},
        # larger frames: a long prefill's token ids, and many small containers
        "long_prefill": {"type": m.STEP, "step_id": 0, "hidden": encode_tensor(torch.zeros(1024, 4)),
                         "new_tokens": [1024], "positions": [0], "token_ids": [list(range(1024))]},
        "many_maps": {"type": m.INFO, "x": [{} for _ in range(5000)]},
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, msg in seeds.items():
        (folder / name).write_bytes(encode_message(msg))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make-corpus":
        make_corpus(Path(sys.argv[2]))
    else:
        atheris.Setup(sys.argv, test_one_input)
        atheris.Fuzz()
