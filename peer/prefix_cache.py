"""Prefix sharing: full KV pages whose whole token prefix was already computed are reused.

Metadata only (no torch), in the style of vLLM's block pool. A page is identified by the
hash of *every* token up to and including it, chained page by page
(`h_k = sha256(h_{k-1} | tokens of page k)`, `h_{-1} = sha256(namespace)`), where the
namespace names the layer range and the weights' fingerprint: the KV (and the output hidden
states) of a page depend on exactly those. Two sessions whose token prefixes agree page by page
get the same hashes, so the second attaches the first one's pages instead of computing them.

Rules that keep shared pages correct:
- only FULL pages are registered, after the step that filled them succeeded; nobody ever writes
  into a registered page (writes go to positions >= a sequence's length, past its full pages);
- a sequence that truncates into a registered page stops using it: if nobody else references it,
  the page is simply unregistered (it becomes private again); otherwise the sequence gets a
  private copy (copy-on-write, `SessionRegistry.truncate`);
- a registered page whose last reference goes away stays cached (evictable, counted as free in
  `PagePool.num_free`) until an allocation needs it: least recently used first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from shards.paging import PagePool

MAX_TOKEN_ID = 2**31 - 1


def root_hash(namespace: str) -> bytes:
    return hashlib.sha256(b"layerswarm-prefix|" + namespace.encode()).digest()


def chain_hashes(parent: bytes, tokens: Sequence[int], page_size: int) -> list[bytes]:
    """Hashes of the full pages in `tokens` (which start at a page boundary), chained from `parent`."""
    hashes = []
    for start in range(0, len(tokens) - page_size + 1, page_size):
        page = tokens[start : start + page_size]
        parent = hashlib.sha256(parent + b"".join(t.to_bytes(4, "little") for t in page)).digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    """hash -> page id for registered (full, immutable) pages; forgets pages the pool evicts."""

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self._page_of: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        pool.on_evict = self._forget
        self.hits = 0  # pages attached instead of computed
        self.registered = 0

    def __len__(self) -> int:
        return len(self._page_of)

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """Pages of the longest run of `hashes`, from the first, that are cached (no refcount change)."""
        pages = []
        for h in hashes:
            page = self._page_of.get(h)
            if page is None:
                break
            pages.append(page)
        return pages

    def register(self, h: bytes, page: int) -> bool:
        """Publish a full page the caller just computed; False if that prefix is cached already."""
        if h in self._page_of or page in self._hash_of:
            return False
        self._page_of[h] = page
        self._hash_of[page] = h
        self.pool.mark_cacheable(page)
        self.registered += 1
        return True

    def is_registered(self, page: int) -> bool:
        return page in self._hash_of

    def unregister(self, page: int) -> None:
        """The page's content is about to change (truncate into it): nobody may attach it any more."""
        h = self._hash_of.pop(page, None)
        if h is not None:
            del self._page_of[h]
            self.pool.mark_cacheable(page, False)

    def clear(self) -> None:
        """Forget every registered page (their content is gone: a new KV cache); evictable ones are free again."""
        for page in list(self._hash_of):
            self.unregister(page)

    def _forget(self, page: int) -> None:
        h = self._hash_of.pop(page, None)
        if h is not None:
            del self._page_of[h]
