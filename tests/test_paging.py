"""PagePool / PageTable: exact page ids, reuse, full pool, and no leaks under random churn."""

from __future__ import annotations

import random

import pytest

from shards import PagePool, PageTable
from shards.paging import DROPPED


def test_fresh_pool_hands_out_lowest_ids_first() -> None:
    pool = PagePool(8, page_size=4)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate() == [3]
    assert pool.num_free == 4


def test_freed_pages_are_reused_after_unused_ones() -> None:
    pool = PagePool(6)
    a = pool.allocate(4)
    pool.free([a[1], a[0]])
    assert pool.allocate(2) == [4, 5]
    assert pool.allocate(2) == [1, 0]  # freed order, FIFO
    assert pool.allocate(1) is None


def test_allocate_none_when_full_takes_nothing() -> None:
    pool = PagePool(4)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate(2) is None
    assert pool.num_free == 1
    assert pool.allocate(0) == []


def test_double_free_and_foreign_page_raise() -> None:
    pool = PagePool(4)
    pages = pool.allocate(2)
    pool.free(pages)
    with pytest.raises(ValueError, match="twice"):
        pool.free([pages[0]])
    with pytest.raises(ValueError, match="not in this pool"):
        pool.free([9])
    p = pool.allocate(1)
    with pytest.raises(ValueError, match="twice"):
        pool.free(p + p)
    assert pool.num_free == 3  # the bad call changed nothing


def test_page_table_reserve_truncate_release() -> None:
    pool = PagePool(5, page_size=4)
    t = PageTable()
    assert t.pages_needed(9, 4) == 3
    assert t.reserve(pool, 9) and t.pages == [0, 1, 2] and t.length == 9
    assert t.reserve(pool, 12) and t.pages == [0, 1, 2]  # still fits
    assert not t.reserve(pool, 21)  # needs 6 pages, pool has 5
    assert t.pages == [0, 1, 2] and t.length == 12 and pool.num_free == 2
    t.truncate(pool, 5)  # rejected speculative tokens
    assert t.pages == [0, 1] and t.length == 5 and pool.num_free == 3
    t.truncate(pool, 4)
    assert t.pages == [0]
    t.release(pool)
    assert t.pages == [] and t.length == 0 and pool.num_free == 5
    with pytest.raises(ValueError):
        t.truncate(pool, 3)


def test_pages_that_slid_out_of_the_window_are_freed_and_the_table_stays_positional() -> None:
    pool = PagePool(6, page_size=4)
    t = PageTable()
    assert t.reserve(pool, 14) and t.pages == [0, 1, 2, 3]
    assert t.drop_before(pool, 7) == 1  # page 0 holds positions 0..3 only; page 1 still holds 4..6
    assert t.pages == [DROPPED, 1, 2, 3] and t.held == [1, 2, 3] and t.dropped == 1 and pool.num_free == 3
    assert t.drop_before(pool, 7) == 0 and t.drop_before(pool, -5) == 0  # nothing more to free
    assert t.drop_before(pool, 12) == 2 and t.pages == [DROPPED] * 3 + [3] and pool.num_free == 5
    assert t.reserve(pool, 20) and t.pages == [DROPPED] * 3 + [3, 4]  # growth appends: page of t is pages[t // 4]
    with pytest.raises(ValueError, match="slid out"):
        t.truncate(pool, 10)  # the next token would go into freed page 2
    assert t.pages == [DROPPED] * 3 + [3, 4] and t.length == 20  # the refused call changed nothing
    t.truncate(pool, 13)
    assert t.pages == [DROPPED] * 3 + [3] and t.dropped == 3 and pool.num_free == 5
    t.truncate(pool, 8)  # at a page boundary: the next token takes a fresh page
    assert t.pages == [DROPPED] * 2 and t.dropped == 2 and pool.num_free == 6
    t.release(pool)
    assert t.pages == [] and t.dropped == 0 and pool.num_free == 6


def test_dropping_a_shared_page_keeps_it_for_the_other_sequence() -> None:
    pool = PagePool(4, page_size=4)
    a, b = PageTable(), PageTable()
    assert a.reserve(pool, 8)
    b.attach(pool, a.pages[:1])
    assert a.drop_before(pool, 8) == 2
    assert pool.refcount(0) == 1 and b.held == [0] and pool.num_free == 3


def test_random_churn_never_leaks() -> None:
    rng = random.Random(0)
    pool = PagePool(40, page_size=4)
    open_tables: list[PageTable] = []
    for _ in range(1000):
        op = rng.choice(["open", "grow", "truncate", "close", "slide"])
        if op == "open":
            t = PageTable()
            if t.reserve(pool, rng.randint(1, 30)):
                open_tables.append(t)
            else:
                assert t.pages == [] and t.length == 0
        elif open_tables:
            t = rng.choice(open_tables)
            if op == "grow":
                before = (list(t.pages), t.length, pool.num_free)
                if not t.reserve(pool, t.length + rng.randint(1, 20)):
                    assert (t.pages, t.length, pool.num_free) == before
            elif op == "truncate":
                length = rng.randint(0, t.length)
                if length % 4 == 0 or length // 4 >= t.dropped:  # never into a freed page
                    t.truncate(pool, length)
            elif op == "slide":
                t.drop_before(pool, t.length - rng.randint(1, 12))
            else:
                t.release(pool)
                open_tables.remove(t)
        used = [p for t in open_tables for p in t.held]
        assert len(used) == len(set(used))  # no page owned twice
        assert pool.num_free + len(used) == pool.num_pages
        for t in open_tables:
            assert len(t.pages) == -(-t.length // pool.page_size)
            assert t.pages[: t.dropped] == [DROPPED] * t.dropped and DROPPED not in t.held
    for t in open_tables:
        t.release(pool)
    assert pool.num_free == pool.num_pages
