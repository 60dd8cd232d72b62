"""Per-client rate limit on compute requests: a token bucket per remote peer id."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """At most `rate` requests per second per remote, with bursts of up to `burst`.

    A burst lets a client prefill and catch up after a pause; the sustained rate stops one
    client from taking the whole peer. `rate <= 0` disables the limit.
    """

    def __init__(self, rate: float, burst: float | None = None, max_remotes: int = 100_000) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, 2 * rate)
        self.max_remotes = max_remotes  # bounded memory even if strangers rotate ids
        self._buckets: dict[str, _Bucket] = {}

    def allow(self, remote: str, now: float | None = None) -> bool:
        if self.rate <= 0:
            return True
        now = time.monotonic() if now is None else now
        bucket = self._buckets.get(remote)
        if bucket is None:
            if len(self._buckets) >= self.max_remotes:
                self._forget_idle(now)
            bucket = self._buckets[remote] = _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _forget_idle(self, now: float) -> None:
        """Drop buckets that have refilled completely: forgetting them changes nothing."""
        full = [r for r, b in self._buckets.items() if b.tokens + (now - b.updated) * self.rate >= self.burst]
        for remote in full:
            del self._buckets[remote]
        if len(self._buckets) >= self.max_remotes:  # still full: drop the oldest half
            for remote, _ in sorted(self._buckets.items(), key=lambda kv: kv[1].updated)[: self.max_remotes // 2]:
                del self._buckets[remote]
