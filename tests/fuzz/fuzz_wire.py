"""Coverage-guided fuzzer (atheris / libFuzzer) for the wire decoder and the request validators.

Every input is one frame payload, decoded and validated exactly as a peer does before acting on
it. Anything but a clean result or a ProtocolError is a bug (atheris stops and saves the input).
Allocation is bounded by the small limits below: a frame may never make us build more.

    .venv/bin/python tests/fuzz/fuzz_wire.py tests/fuzz/corpus -runs=100000
    .venv/bin/python tests/fuzz/fuzz_wire.py --make-corpus tests/fuzz/corpus   # rewrite the seeds
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from swarm import messages as m
    from swarm.codec import Limits, decode_message, encode_message, encode_tensor
    from swarm.errors import ProtocolError

LIMITS = Limits(max_frame_bytes=1 << 16, max_tensor_elements=1 << 12)


def validate(msg: dict) -> None:
    """The checks a peer applies to each request type before touching sessions or compute."""
    kind = m.require_type(msg)
    if kind in (m.FORWARD, m.STEP, m.PUSH):
        hidden = m.require_tensor(msg, "hidden", LIMITS, ndim=2)
        new_tokens = m.require_int_list(msg, "new_tokens", min=1, max=1 << 16)
        if sum(new_tokens) != hidden.shape[0]:
            raise ProtocolError("bad_field", "rows != new_tokens")
    if kind in (m.STEP, m.PUSH):
        m.require_int(msg, "step_id", min=0)
        m.require_int_list(msg, "positions", min=0)
    if kind == m.OPEN:
        m.require_int(msg, "max_length", min=1)
        m.require_int(msg, "batch", min=1, default=1)
        m.require_str(msg, "session_id", max_len=128, default="")
    if "layers" in msg:
        m.require_layers(msg)
    if kind == m.TRUNCATE:
        m.require_int(msg, "length", min=0)


def test_one_input(data: bytes) -> None:
    try:
        validate(decode_message(data, LIMITS))
    except ProtocolError:
        pass


def make_corpus(folder: Path) -> None:
    """Seed inputs: one well-formed frame per request type."""
    import torch

    hidden = encode_tensor(torch.zeros(2, 4))
    seeds = {
        "info": {"type": m.INFO},
        "open": {"type": m.OPEN, "session_id": "s", "max_length": 64, "batch": 1, "layers": [0, 2]},
        "step": {"type": m.STEP, "step_id": 1, "hidden": hidden, "new_tokens": [2], "positions": [0]},
        "forward": {"type": m.FORWARD, "hidden": hidden, "new_tokens": [1, 1], "layers": [0, 1]},
        "push": {"type": m.PUSH, "session_id": "s", "step_id": 1, "hidden": hidden, "new_tokens": [2],
                 "positions": [0], "next": [["peer", "s2"]]},
        "truncate": {"type": m.TRUNCATE, "length": 3},
        "close": {"type": m.CLOSE},
        "bf16": {"type": m.STEP, "step_id": 1, "hidden": encode_tensor(torch.zeros(1, 4, dtype=torch.bfloat16)),
                 "new_tokens": [1], "positions": [5]},
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
