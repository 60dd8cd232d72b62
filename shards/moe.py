"""Mixture of experts (Mixtral, Qwen3-MoE): a router picks top-k experts per token.

`MoEBlock` is a DecoderBlock whose MLP is `router` + `experts` (a ModuleList of `Expert`, each a
gated MLP with the same fused `w_gate_up` / `w_down` linears as the dense block, so weight-only
quantization swaps them the same way). Tokens are grouped by expert: one sort per layer, then
one batched matmul pair per expert that any token of the step chose, then one copy back to
token order and a sum over each token's k experts. A single token (decode of one sequence)
skips the grouping: its k experts run one after the other and their outputs are summed.

On CPU, unquantized experts run as two `torch._grouped_mm` calls over all experts: loading
re-homes the experts' weights into two stacked `(E, out, in)` tensors that each expert's linear
views. Quantizing (or moving) the experts replaces those views; the stacks are then dropped and
the per-expert loop runs the QuantLinears.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate

import torch
from torch import nn

from shards.block import DecoderBlock
from shards.config import ModelConfig


class Expert(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.w_gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.w_down = nn.Linear(intermediate, hidden, bias=False)

    def run(self, h: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """h (n, hidden) -> (n, hidden): act(gate) * up, projected down (the dense block's MLP)."""
        gate, up = self.w_gate_up(h).chunk(2, dim=-1)  # (n, I) each
        return self.w_down(act(gate) * up)


class MoEBlock(DecoderBlock):
    def init_mlp(self, c: ModelConfig) -> None:
        self.top_k, self.norm_topk_prob = c.num_experts_per_tok, c.norm_topk_prob
        self.router = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(c.hidden_size, c.expert_intermediate_size) for _ in range(c.num_experts))
        self._stacked: tuple[torch.Tensor, torch.Tensor] | None = None  # (E, 2I, H), (E, H, I); see stack_experts

    def load_hf(self, config: ModelConfig, layer: int, tensors: dict[str, torch.Tensor]) -> None:
        super().load_hf(config, layer, tensors)
        self.stack_experts()

    def stack_experts(self) -> None:
        """Move every expert's weights into two stacked tensors that the experts' linears then view."""
        gate_up = torch.stack([e.w_gate_up.weight.detach() for e in self.experts])  # (E, 2I, H)
        down = torch.stack([e.w_down.weight.detach() for e in self.experts])  # (E, H, I)
        for e, g, d in zip(self.experts, gate_up, down):
            e.w_gate_up.weight = nn.Parameter(g, requires_grad=False)
            e.w_down.weight = nn.Parameter(d, requires_grad=False)
        self._stacked = (gate_up, down)

    def _stacks(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The stacked weights if every expert is still a plain linear viewing them, on CPU; else None."""
        if self._stacked is None:
            return None
        gate_up, down = self._stacked
        for i, e in enumerate(self.experts):
            for lin, stack in ((e.w_gate_up, gate_up), (e.w_down, down)):
                if type(lin) is not nn.Linear or lin.weight.data_ptr() != stack[i].data_ptr():
                    self._stacked = None  # quantized or moved: free the stacks, loop over the experts
                    return None
        return self._stacked if gate_up.device.type == "cpu" and hasattr(torch, "_grouped_mm") else None

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        """Normed h (N, hidden) -> sum over each token's top-k experts of weight * expert(h)."""
        N = h.shape[0]
        probs = self.router(h).float().softmax(dim=-1)  # (N, E), float32 as in HF
        weights, chosen = probs.topk(self.top_k, dim=-1)  # (N, k) each
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if N == 1:  # nothing to group: sorting, counting and scattering back cost more than the experts
            out = None
            for e, w in zip(chosen[0].tolist(), weights[0].tolist()):  # one host sync, like the counts below
                y = self.experts[e].run(h, self.act) * w  # (1, hidden); w is float32, as HF weighs
                out = y if out is None else out + y
            return out
        flat = chosen.reshape(-1)  # (N*k,) expert of each (token, slot)
        order = flat.argsort(stable=True)  # (N*k,) grouped by expert
        rows = order // self.top_k  # (N*k,) token of each grouped entry
        w = weights.reshape(-1).index_select(0, order)  # (N*k,)
        x = h.index_select(0, rows)  # (N*k, hidden) each token once per expert it chose, grouped by expert
        stacks = self._stacks()
        if stacks is not None:  # all experts in two grouped matmuls; row groups end at `ends`
            ends = torch.bincount(flat, minlength=len(self.experts)).cumsum(0).to(torch.int32)  # (E,)
            gate, up = torch._grouped_mm(x, stacks[0].transpose(1, 2), offs=ends).chunk(2, dim=-1)  # (N*k, I) each
            y = torch._grouped_mm(self.act(gate) * up, stacks[1].transpose(1, 2), offs=ends)  # (N*k, hidden)
        else:
            counts = torch.bincount(flat, minlength=len(self.experts)).tolist()  # one host sync per layer
            y = torch.cat([self.experts[e].run(x[end - n : end], self.act)
                           for e, (n, end) in enumerate(zip(counts, accumulate(counts))) if n])  # (N*k, hidden)
        grouped = (y.float() * w[:, None]).to(h.dtype)  # (N*k, hidden) weighted, in float32 as HF
        # Back to (token, slot) order and sum the k slots. index_copy_, not index_add_: CPU
        # index_add_ (a scatter_add) costs tens of ms here, a copy microseconds.
        return torch.empty_like(grouped).index_copy_(0, order, grouped).view(N, self.top_k, -1).sum(dim=1)

    @classmethod
    def mlp_weight_map(cls, config: ModelConfig, layer: int) -> dict[str, list[str]]:
        if config.model_type == "mixtral":  # w1 = gate, w3 = up, w2 = down
            moe, gate, up, down, router = "block_sparse_moe", "w1", "w3", "w2", "gate"
        else:  # qwen3_moe
            moe, gate, up, down, router = "mlp", "gate_proj", "up_proj", "down_proj", "gate"
        m = {"router.weight": [f"{moe}.{router}.weight"]}
        for e in range(config.num_experts):
            p = f"{moe}.experts.{e}."
            m[f"experts.{e}.w_gate_up.weight"] = [f"{p}{gate}.weight", f"{p}{up}.weight"]
            m[f"experts.{e}.w_down.weight"] = [f"{p}{down}.weight"]
        return m
