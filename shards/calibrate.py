"""Calibrated int4 (GPTQ): quantize each linear so that its *outputs* on real text stay close.

Round-to-nearest int4 loses a lot on small models (SmolLM2-135M: +66% perplexity). GPTQ
(Frantar et al., 2022) quantizes a weight matrix one input column at a time and spreads each
column's rounding error over the columns not yet quantized, weighted by the inverse Hessian
H = X^T X of the layer's inputs X on a calibration text. Per-group scales and mins are chosen
when a group starts (from the error-updated weights), columns go in their natural order
(act-order off), so the result is exactly our `kernels.quant_matmul` int4 format and runs on
the same kernels.

Layers go one at a time, in order: layer i is calibrated on the outputs of the already
quantized layers 0..i-1, so it learns to correct their error too. Memory stays near one
layer's weights plus the calibration activations.

`calibration_batch(head, ids, seq_len)` turns token ids into hidden states and a stateless
layout; `calibrate_layer(shard, layer, hidden, layout, group_size)` quantizes one layer in place
and returns the hidden states for the next; `calibrate_shard` runs every layer of a shard.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch
from torch import nn

from kernels.quant_matmul import int4_group_params, int4_round, pack_int4
from shards.batch import BatchLayout
from shards.head import ModelHead
from shards.quant import LINEAR_NAMES, QuantLinear

DAMP = 0.01  # added to H's diagonal, relative to its mean: GPTQ's default, keeps H invertible


@torch.no_grad()
def gptq_int4(
    w: torch.Tensor, h: torch.Tensor, group_size: int = 128, damp: float = DAMP
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w (N, K), h (K, K) = sum of x^T x over calibration inputs -> (qweight, scales, mins)
    in `quantize_int4`'s format (K padded to a multiple of `group_size`)."""
    G = group_size
    W = w.detach().float().clone()  # (N, K), updated as columns are quantized
    N, K = W.shape
    H = h.detach().float().clone()
    dead = torch.diag(H) == 0  # inputs that were always zero: their weights never matter
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    hinv = _inverse_hessian_factor(H, damp)  # (K, K) upper Cholesky factor of H^-1
    ng = -(-K // G)
    S = torch.empty(N, ng, dtype=torch.bfloat16, device=W.device)
    M = torch.empty(N, ng, dtype=torch.bfloat16, device=W.device)
    Qt = torch.zeros(ng * G, N, dtype=torch.uint8, device=W.device)  # columns as rows: contiguous updates
    for g in range(ng):
        i1, i2 = g * G, min(K, g * G + G)
        W1 = W[:, i1:i2].t().contiguous()  # (width, N): this group, with the error of earlier groups folded in
        h1 = hinv[i1:i2, i1:i2]
        err1 = torch.zeros_like(W1)
        s, m = int4_group_params(W1.t()[:, None, :])  # (N, 1) bf16 each
        S[:, g], M[:, g] = s[:, 0], m[:, 0]
        s32, m32 = s[:, 0].float(), m[:, 0].float()
        for i in range(i2 - i1):
            col = W1[i]  # (N,)
            q = int4_round(col, s32, m32)
            Qt[i1 + i] = q
            e = (col - (q.float() * s32 + m32)) / h1[i, i]  # (N,)
            W1[i:] -= h1[i, i:, None] * e[None, :]
            err1[i] = e
        W[:, i2:] -= err1.t() @ hinv[i1:i2, i2:]  # the group's error, spread over the later columns
    Q = Qt.t().contiguous()
    return pack_int4(Q, G), S.t().contiguous(), M.t().contiguous()


def _inverse_hessian_factor(H: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp * mean(diag H) * I)^-1; more damping if H is singular."""
    K = H.shape[0]
    mean_diag = torch.diag(H).mean()
    for attempt in range(5):
        Hd = H + (damp * 10**attempt) * mean_diag * torch.eye(K, device=H.device)
        L, info = torch.linalg.cholesky_ex(Hd)
        if int(info) == 0:
            return torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)
    raise ValueError("calibration Hessian is not positive definite even with 10^4 x damping; use more text")


def calibration_batch(head: ModelHead, ids: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, BatchLayout]:
    """ids (T,) -> hidden (n * seq_len, hidden) float32 and a stateless layout of n sequences."""
    n = ids.numel() // seq_len
    if n < 1:
        raise ValueError(f"the calibration text has {ids.numel()} tokens; need at least {seq_len}")
    ids = ids[: n * seq_len]
    return head.embed(ids).float(), BatchLayout([seq_len] * n, [0] * n, None)


@torch.no_grad()
def calibrate_layer(shard: nn.Module, layer: int, hidden: torch.Tensor, layout: BatchLayout,
                    group_size: int = 128, int8: Collection[str] = ()) -> torch.Tensor:
    """GPTQ-quantize the four linears of absolute `layer` of `shard` in place (int4; the ones named
    in `int8` to int8 per channel instead: the mixed mode) and return the layer's output on
    `hidden` with the quantized weights (the next layer's input)."""
    block = shard.blocks[layer - shard.start]
    hessians: dict[str, torch.Tensor] = {}

    def collect(name: str) -> Callable:
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0].reshape(-1, args[0].shape[-1]).float()  # (tokens, K)
            hessians[name] = hessians.get(name, 0) + x.t() @ x
        return hook

    handles = [getattr(block, name).register_forward_pre_hook(collect(name)) for name in LINEAR_NAMES]
    try:
        shard.forward(hidden, layout, None, layers=(layer, layer + 1))
    finally:
        for handle in handles:
            handle.remove()
    for name in LINEAR_NAMES:
        lin = getattr(block, name)
        if not isinstance(lin, nn.Linear):
            raise ValueError(f"layer {layer} {name} is already quantized")
        if name in int8:
            setattr(block, name, QuantLinear.from_linear(lin, "int8"))
            continue
        q, s, m = gptq_int4(lin.weight, hessians.pop(name), group_size)
        bias = lin.bias.detach() if lin.bias is not None else None
        setattr(block, name, QuantLinear.from_int4(q, s, m, lin.in_features, bias, group_size))
    return shard.forward(hidden, layout, None, layers=(layer, layer + 1)).float()


def calibrate_shard(shard: nn.Module, hidden: torch.Tensor, layout: BatchLayout, group_size: int = 128,
                    progress: Callable[[int], None] | None = None, int8: Collection[str] = ()) -> None:
    """Quantize every layer of `shard` in order (int4, GPTQ; `int8` linears to int8);
    `progress(layer)` after each."""
    for layer in range(shard.start, shard.end):
        hidden = calibrate_layer(shard, layer, hidden, layout, group_size, int8)
        if progress is not None:
            progress(layer)
    shard.quant = "int4"
