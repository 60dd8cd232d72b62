"""KV page bookkeeping (metadata only, no torch), in the style of vLLM's block pool.

A `PagePool` hands out page ids; a `PageTable` is one sequence's list of pages plus its
length in tokens. Token `t` of a sequence lives in page `pages[t // page_size]` at offset
`t % page_size`. The tensors these ids index live in `shards.kv_cache.KVCache`.

Pages are reference counted so full pages of a common prefix can be shared between sequences
(see `peer/prefix_cache.py`). A page whose count drops to zero goes back to the free list,
unless it was marked `cacheable` (it holds a complete, reusable prefix page): then it waits in
an LRU list of *evictable* pages. Evictable pages count as free (`num_free`) and are handed out
only when no never-used or plainly freed page is left, least recently used first.

Sliding windows: when every served layer attends only to the last `window` keys, a sequence's
pages that hold nothing but older keys are freed (`PageTable.drop_before`). Their entries stay
in the table as `DROPPED`, so `pages[t // page_size]` stays position-correct.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

DROPPED = -1  # page table entry of a freed page whose keys slid out of every layer's window


class PagePool:
    """Free list of page ids, reference counts, and the LRU of evictable cached pages.

    Order: a fresh pool hands out ids 0, 1, 2, ...; freed pages go to the END of the free
    list (FIFO), so they are reused only after the never-used ones, which keeps recently
    freed pages (possibly still read by an in-flight step elsewhere) out of the way longest.
    Evictable pages are reused only when the free list is empty, oldest release first;
    `on_evict(page)` is called for each, so the prefix index forgets it.
    """

    def __init__(self, num_pages: int, page_size: int = 16) -> None:
        if num_pages < 0 or page_size < 1:
            raise ValueError(f"need num_pages >= 0 and page_size >= 1, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: deque[int] = deque(range(num_pages))
        self._refs = [0] * num_pages
        self._cacheable = [False] * num_pages
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0, content kept; LRU first
        self.on_evict: Callable[[int], None] | None = None
        self.evictions = 0

    @property
    def num_free(self) -> int:
        """Pages an `allocate` can hand out now: never-used, freed, and evictable cached pages."""
        return len(self._free) + len(self._evictable)

    @property
    def num_evictable(self) -> int:
        """Free pages that still hold a cached prefix page (reusable until evicted)."""
        return len(self._evictable)

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def is_cacheable(self, page: int) -> bool:
        return self._cacheable[page]

    def allocate(self, n: int = 1) -> list[int] | None:
        """Take n pages (refcount 1 each), or return None and take nothing when fewer than n are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > self.num_free:
            return None
        pages = []
        for _ in range(n):
            if self._free:
                p = self._free.popleft()
            else:
                p, _ = self._evictable.popitem(last=False)  # least recently used
                self._cacheable[p] = False
                self.evictions += 1
                if self.on_evict is not None:
                    self.on_evict(p)
            self._refs[p] = 1
            pages.append(p)
        return pages

    def incref(self, pages: Iterable[int]) -> None:
        """One more sequence uses each page; an evictable page is taken out of the LRU list."""
        pages = list(pages)
        for p in pages:
            self._check(p)
            if self._refs[p] == 0 and p not in self._evictable:
                raise ValueError(f"page {p} is free; allocate it instead")
        for p in pages:
            if self._refs[p] == 0:
                del self._evictable[p]
            self._refs[p] += 1

    def free(self, pages: Iterable[int]) -> None:
        """Drop one reference per listed page; a page whose count reaches 0 is free (or evictable).

        Dropping more references than a page has is a bug -> ValueError, and nothing changes.
        """
        pages = list(pages)
        drops: dict[int, int] = {}
        for p in pages:  # validate all first so a bad call changes nothing
            self._check(p)
            drops[p] = drops.get(p, 0) + 1
            if drops[p] > self._refs[p]:
                raise ValueError(f"page {p} freed twice")
        for p in pages:
            self._refs[p] -= 1
            if self._refs[p] == 0:
                if self._cacheable[p]:
                    self._evictable[p] = None  # most recently used end
                else:
                    self._free.append(p)

    def mark_cacheable(self, page: int, cacheable: bool = True) -> None:
        """Whether the page's content outlives its last reference (a registered prefix page)."""
        self._check(page)
        self._cacheable[page] = cacheable
        if not cacheable and page in self._evictable:
            del self._evictable[page]
            self._free.append(page)

    def _check(self, p: int) -> None:
        if not 0 <= p < self.num_pages:
            raise ValueError(f"page {p} is not in this pool (0..{self.num_pages - 1})")


@dataclass
class PageTable:
    """Pages of one sequence and how many tokens it holds."""

    pages: list[int] = field(default_factory=list)  # leading entries may be DROPPED
    length: int = 0
    dropped: int = 0  # how many leading entries of `pages` are DROPPED

    @property
    def held(self) -> list[int]:
        """The page ids this table holds a reference to (not the DROPPED ones)."""
        return self.pages[self.dropped :]

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

    def attach(self, pool: PagePool, shared: list[int]) -> None:
        """Append full pages computed by someone else (refcount +1 each); length grows by whole pages."""
        if not shared:
            return
        if self.length != len(self.pages) * pool.page_size:
            raise ValueError(f"can attach shared pages only at a page boundary, not at {self.length}")
        pool.incref(shared)
        self.pages.extend(shared)
        self.length += len(shared) * pool.page_size

    def drop_before(self, pool: PagePool, position: int) -> int:
        """Free the pages holding only tokens before `position` (slid out of every window); how many."""
        n = min(max(position, 0) // pool.page_size, len(self.pages))
        if n <= self.dropped:
            return 0
        freed = self.pages[self.dropped : n]
        pool.free(freed)
        self.pages[self.dropped : n] = [DROPPED] * len(freed)
        self.dropped = n
        return len(freed)

    def truncate(self, pool: PagePool, new_length: int) -> None:
        """Drop tokens past new_length (rejected speculative tokens), releasing pages left empty.

        The page that would take the next token must not be DROPPED (its earlier tokens are gone):
        ValueError. Whether the keys a later query needs are still held is the caller's check
        (it knows the window; see `SessionRegistry.truncate`).
        """
        if not 0 <= new_length <= self.length:
            raise ValueError(f"truncate({new_length}) outside [0, {self.length}]")
        ps = pool.page_size
        if new_length % ps and new_length // ps < self.dropped:
            raise ValueError(f"truncate({new_length}) into a page that slid out of the window and was freed")
        keep = -(-new_length // ps)
        # Last page first: of a cached prefix chain, the deepest pages become least recently used
        # and are evicted first (a chain is only looked up from its start).
        pool.free(reversed(self.pages[max(keep, self.dropped) :]))
        del self.pages[keep:]
        self.dropped = min(self.dropped, keep)
        self.length = new_length

    def release(self, pool: PagePool) -> None:
        """Free every page (sequence closed)."""
        self.truncate(pool, 0)
