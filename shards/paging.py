"""KV page bookkeeping (metadata only, no torch), in the style of vLLM's block pool.

A `PagePool` hands out page ids; a `PageTable` is one sequence's list of pages plus its
length in tokens. Token `t` of a sequence lives in page `pages[t // page_size]` at offset
`t % page_size`. The tensors these ids index live in `shards.kv_cache.KVCache`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


class PagePool:
    """Free list of page ids.

    Order: a fresh pool hands out ids 0, 1, 2, ...; freed pages go to the END of the free
    list (FIFO), so they are reused only after the never-used ones, which keeps recently
    freed pages (possibly still read by an in-flight step elsewhere) out of the way longest.
    """

    def __init__(self, num_pages: int, page_size: int = 16) -> None:
        if num_pages < 0 or page_size < 1:
            raise ValueError(f"need num_pages >= 0 and page_size >= 1, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: deque[int] = deque(range(num_pages))
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int = 1) -> list[int] | None:
        """Take n pages, or return None and take nothing when fewer than n are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > len(self._free):
            return None
        pages = [self._free.popleft() for _ in range(n)]
        for p in pages:
            self._is_free[p] = False
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Return pages to the pool; freeing a free (or unknown) page is a bug -> ValueError."""
        pages = list(pages)
        seen: set[int] = set()
        for p in pages:  # validate all first so a bad call changes nothing
            if not 0 <= p < self.num_pages:
                raise ValueError(f"page {p} is not in this pool (0..{self.num_pages - 1})")
            if self._is_free[p] or p in seen:
                raise ValueError(f"page {p} freed twice")
            seen.add(p)
        for p in pages:
            self._is_free[p] = True
            self._free.append(p)


@dataclass
class PageTable:
    """Pages of one sequence and how many tokens it holds."""

    pages: list[int] = field(default_factory=list)
    length: int = 0

    def pages_needed(self, new_length: int, page_size: int) -> int:
        """Extra pages required so the table can hold new_length tokens (0 if it already can)."""
        total = -(-new_length // page_size)  # ceil
        return max(0, total - len(self.pages))

    def reserve(self, pool: PagePool, new_length: int) -> bool:
        """Grow capacity to >= new_length tokens and set length; False (no change) if the pool is short."""
        if new_length < self.length:
            raise ValueError(f"reserve({new_length}) would shrink a sequence of {self.length}; use truncate")
        got = pool.allocate(self.pages_needed(new_length, pool.page_size))
        if got is None:
            return False
        self.pages.extend(got)
        self.length = new_length
        return True

    def truncate(self, pool: PagePool, new_length: int) -> None:
        """Drop tokens past new_length (rejected speculative tokens), freeing pages left empty."""
        if not 0 <= new_length <= self.length:
            raise ValueError(f"truncate({new_length}) outside [0, {self.length}]")
        keep = -(-new_length // pool.page_size)
        pool.free(self.pages[keep:])
        del self.pages[keep:]
        self.length = new_length

    def release(self, pool: PagePool) -> None:
        """Free every page (sequence closed)."""
        self.truncate(pool, 0)
