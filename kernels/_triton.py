"""Whether Triton kernels can run on a tensor: CUDA with triton installed, or Triton's CPU
interpreter (`TRITON_INTERPRET=1`, used to check the kernels on machines without a GPU)."""

from __future__ import annotations

import os

import torch

try:
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except ImportError:  # CPU-only installs: every op has a torch fallback
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    HAS_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def triton_ok(t: torch.Tensor) -> bool:
    """True when a Triton kernel may be launched on `t`'s device."""
    return HAS_TRITON and (t.is_cuda or INTERPRET)
