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

    def _segments(self, pages: list[int], start: int, count: int) -> list[tuple[int, int, int]]:
        """(first row in self.rows, first row of the input, length) per page touched by positions start..+count.

        Plain arithmetic and slice copies: a decode step writes one row, and building index tensors
        for it cost more than the copy (measured ~10x on CPU).
        """
        ps, segments, done = self.page_size, [], 0
        while done < count:
            pos = start + done
            length = min(ps - pos % ps, count - done)
            segments.append((pages[pos // ps] * ps + pos % ps, done, length))
            done += length
        return segments

    def write(self, pages: list[int], start: int, rows: torch.Tensor) -> None:
        """Store rows (n, H) of positions start .. start + n - 1 of a sequence with these pages."""
        rows = rows.to(self.rows.dtype)
        for dst, src, length in self._segments(pages, start, rows.shape[0]):
            self.rows[dst : dst + length].copy_(rows[src : src + length])

    def read(self, pages: list[int]) -> torch.Tensor:
        """All rows of these full pages, in order: (len(pages) * page_size, H)."""
        ps = self.page_size
        if not pages:
            return self.rows[:0].clone()
        return torch.cat([self.rows[p * ps : (p + 1) * ps] for p in pages])

    def copy(self, src: int, dst: int) -> None:
        ps = self.page_size
        self.rows[dst * ps : (dst + 1) * ps] = self.rows[src * ps : (src + 1) * ps]
