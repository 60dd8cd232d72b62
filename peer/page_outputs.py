"""`PageOutputs`: the output hidden states stored beside KV pages, for prefix sharing."""

from __future__ import annotations

import torch


class PageOutputs:
    """Output hidden states of every KV page slot, kept in host memory: (num_pages * page_size, H).

    A shared prefix page must give its output rows to every session that attaches it (the peer
    returns outputs for ALL positions of a step), so they are stored beside the page. Cost: one
    hidden vector per cached token, `page_size * hidden_size * dtype bytes` per page (SmolLM2 in
    float32: 2.3 KB per token, 5% of its 30-layer KV; a one-layer shard of a 70B model stores
    8192 * 2 bytes per token, 4x that layer's KV).
    """

    def __init__(self, num_pages: int, page_size: int, hidden_size: int, dtype: torch.dtype) -> None:
        self.page_size = page_size
        self.rows = torch.zeros(num_pages * page_size, hidden_size, dtype=dtype)

    def _slots(self, pages: list[int], start: int, count: int) -> torch.Tensor:
        positions = torch.arange(start, start + count)
        return torch.tensor(pages, dtype=torch.long)[positions // self.page_size] * self.page_size + positions % self.page_size

    def write(self, pages: list[int], start: int, rows: torch.Tensor) -> None:
        """Store rows (n, H) of positions start .. start + n - 1 of a sequence with these pages."""
        if rows.shape[0]:
            self.rows.index_copy_(0, self._slots(pages, start, rows.shape[0]), rows.to(self.rows.dtype))

    def read(self, pages: list[int]) -> torch.Tensor:
        """All rows of these full pages, in order: (len(pages) * page_size, H)."""
        return self.rows.index_select(0, self._slots(pages, 0, len(pages) * self.page_size))

    def copy(self, src: int, dst: int) -> None:
        ps = self.page_size
        self.rows[dst * ps : (dst + 1) * ps] = self.rows[src * ps : (src + 1) * ps]
