"""Which pages of a file the page cache holds (mincore), and dropping them: for tests of shards.pre_read."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

from shards.pre_read import Span

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_pages(file: Path) -> list[bool]:
    """Which pages of `file` the page cache holds (mincore over a fresh read-only mapping)."""
    size = file.stat().st_size
    fd = os.open(file, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return [bool(v & 1) for v in vec]
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(file: Path) -> None:
    """Write back and drop `file`'s pages (dirty pages cannot be dropped, hence the fsync)."""
    fd = os.open(file, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def span_pages(span: Span) -> list[bool]:
    """Which pages holding `span`'s bytes the page cache holds."""
    return resident_pages(span.file)[span.begin // mmap.PAGESIZE:(span.end - 1) // mmap.PAGESIZE + 1]


def span_resident(span: Span) -> bool:
    """Does the page cache hold every page of `span`?"""
    return all(span_pages(span))


def any_resident(spans: list[Span]) -> bool:
    """Does the page cache hold any page of `spans`?"""
    return any(any(span_pages(s)) for s in spans)
