"""BatchLayout: one step's ragged batch (vLLM style) and the index tensors derived from it.

The new tokens of all sequences are concatenated into `N` rows. Attention needs them per
sequence, so `LayoutTensors` holds indices that scatter the rows into a padded `(B, T)` grid
and back, the key slots each sequence reads from the paged cache, and the mask. They are
built once per step (Python loops over sequences happen here, not in the layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass(frozen=True)
class LayoutTensors:
    """Index tensors for one step on one device. B sequences, T = max new, L = max keys."""

    positions: torch.Tensor  # (N,) absolute position of each new token
    query_index: torch.Tensor  # (B, T) row in N of each padded query (pads point at row 0)
    token_index: torch.Tensor  # (N,) flat index into B*T of each row (to unpad)
    mask: torch.Tensor | None  # (B, 1, T, L) True = may attend; None when every entry is True
    slots: torch.Tensor | None  # (N,) flat cache slot (page * page_size + offset) for new K/V
    key_slots: torch.Tensor | None  # (B, L) flat cache slot of each key; None when stateless
    key_rows: torch.Tensor | None  # (KVH * B * L,) rows of the (slots * KVH, D) cache view, head-major
    window: int | None = None  # sliding window the mask applies (keys older than `window` are hidden)


@dataclass
class BatchLayout:
    """Which tokens each sequence brings this step and where its cache pages are.

    `page_tables=None` means stateless: no cache, each sequence attends causally to its own
    new tokens only (positions still start at `cached_tokens`).
    """

    new_tokens: list[int]
    cached_tokens: list[int]
    page_tables: list[list[int]] | None
    page_size: int = 16
    _tensors: dict[str, LayoutTensors] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.new_tokens) != len(self.cached_tokens):
            raise ValueError(f"{len(self.new_tokens)} new_tokens vs {len(self.cached_tokens)} cached_tokens")
        if any(n < 1 for n in self.new_tokens) or any(c < 0 for c in self.cached_tokens):
            raise ValueError(f"need new_tokens >= 1 and cached_tokens >= 0: {self.new_tokens}, {self.cached_tokens}")
        if self.page_tables is not None:
            if len(self.page_tables) != len(self.new_tokens):
                raise ValueError(f"{len(self.page_tables)} page tables for {len(self.new_tokens)} sequences")
            for i, (pages, n, c) in enumerate(zip(self.page_tables, self.new_tokens, self.cached_tokens)):
                if len(pages) * self.page_size < n + c:
                    raise ValueError(
                        f"sequence {i}: {len(pages)} pages of {self.page_size} cannot hold {c + n} tokens"
                    )

    @classmethod
    def decode(cls, cached_tokens: list[int], page_tables: list[list[int]], page_size: int = 16) -> BatchLayout:
        """One new token per sequence."""
        return cls([1] * len(cached_tokens), list(cached_tokens), page_tables, page_size)

    @property
    def num_tokens(self) -> int:
        return sum(self.new_tokens)

    def tensors(self, device: torch.device | str, num_kv_heads: int = 1, window: int | None = None) -> LayoutTensors:
        """Derived index tensors, built on first use per (device, KV heads, window) and reused by every layer.

        With a `window`, a query at position p sees keys p - window < j <= p (transformers'
        sliding window); the index tensors are shared with the full-attention ones.
        """
        key = f"{device}/{num_kv_heads}/{window}"
        if key not in self._tensors:
            if window is None:
                self._tensors[key] = self._build(torch.device(device), num_kv_heads)
            else:
                full = self.tensors(device, num_kv_heads)
                mask = self._mask(window)
                mask = None if bool(mask.all()) else mask.to(device)
                self._tensors[key] = replace(full, mask=mask, window=window)
        return self._tensors[key]

    def _build(self, device: torch.device, num_kv_heads: int) -> LayoutTensors:
        new = torch.tensor(self.new_tokens, dtype=torch.long)  # (B,)
        cached = torch.tensor(self.cached_tokens, dtype=torch.long)  # (B,)
        B, T = len(self.new_tokens), int(new.max())
        starts = torch.cumsum(new, 0) - new  # (B,) first row of each sequence
        t = torch.arange(T)  # (T,)
        valid_q = t[None, :] < new[:, None]  # (B, T)
        query_index = torch.where(valid_q, starts[:, None] + t[None, :], 0)  # (B, T)
        seq_of_row = torch.repeat_interleave(torch.arange(B), new)  # (N,)
        offset_in_seq = torch.arange(len(seq_of_row)) - starts[seq_of_row]  # (N,)
        positions = cached[seq_of_row] + offset_in_seq  # (N,)
        token_index = seq_of_row * T + offset_in_seq  # (N,)

        if self.page_tables is None:
            # Keys are this step's own tokens: key j sits at padded column j.
            slots = key_slots = key_rows = None
        else:
            total = cached + new  # (B,)
            L = int(total.max())
            key_pos = torch.arange(L)  # (L,)
            # Padded page table (B, P): position j of sequence b is slot table[b, j // ps] * ps + j % ps.
            P = max(len(p) for p in self.page_tables)
            table = torch.tensor([p + [0] * (P - len(p)) for p in self.page_tables], dtype=torch.long)  # (B, P)
            # Pages dropped after sliding out of the window (DROPPED = -1) read page 0: the window mask hides them.
            table = table.clamp(min=0)
            ps = self.page_size
            key_slots = table[:, key_pos // ps] * ps + key_pos % ps  # (B, L)
            slots = key_slots[seq_of_row, positions]  # (N,)
            key_slots = torch.where(key_pos[None, :] < total[:, None], key_slots, 0)  # pads read slot 0
            # Gathering keys head-major lets decode attention run as plain batched matmuls
            # over (KVH * B) without copying the gathered K/V again to transpose them.
            heads = torch.arange(num_kv_heads)[:, None, None]  # (KVH, 1, 1)
            key_rows = (key_slots[None] * num_kv_heads + heads).reshape(-1)  # (KVH * B * L,)
        mask = self._mask(None)  # (B, 1, T, L)

        def dev(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.to(device)

        return LayoutTensors(
            positions=dev(positions),
            query_index=dev(query_index),
            token_index=dev(token_index),
            mask=None if bool(mask.all()) else dev(mask),
            slots=dev(slots),
            key_slots=dev(key_slots),
            key_rows=dev(key_rows),
        )

    def _mask(self, window: int | None) -> torch.Tensor:
        """(B, 1, T, L) True = may attend: causal, within each sequence's keys, and inside `window`."""
        new = torch.tensor(self.new_tokens, dtype=torch.long)  # (B,)
        cached = torch.tensor(self.cached_tokens, dtype=torch.long)  # (B,)
        B, T = len(self.new_tokens), int(new.max())
        t = torch.arange(T)  # (T,)
        valid_q = t[None, :] < new[:, None]  # (B, T)
        if self.page_tables is None:
            key_pos, q_pos, key_len = t, t[None, :].expand(B, T), new  # keys are this step's own tokens
        else:
            key_len = cached + new  # (B,)
            key_pos, q_pos = torch.arange(int(key_len.max())), cached[:, None] + t[None, :]  # (L,), (B, T)
        k, q = key_pos[None, None, :], q_pos[:, :, None]  # (1, 1, L), (B, T, 1)
        mask = (k <= q) & (k < key_len[:, None, None])  # (B, T, L)
        if window is not None:
            mask &= k > q - window
        # Padded query rows are dropped later; let them see key 0 so softmax stays finite.
        return (mask | ~valid_q[:, :, None] & (key_pos == 0)[None, None, :])[:, None]  # (B, 1, T, L)
