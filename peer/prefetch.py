"""Fetch every layer's weight files of a Hub model in the background, so a self-placing peer's later
moves (and a standby's) load their layers from disk instead of the network.

A move's load is a window in which the swarm is weaker: the mover serves nothing while it loads in
place, and a standby guards nothing. From the network a layer of a 70B model takes many seconds;
from disk, about one (docs/balancing.md, "Moves from disk").
"""

from __future__ import annotations

import logging
import threading
import time

from shards.resolve import ResolveError, prefetch_layers

logger = logging.getLogger(__name__)


def prefetch_in_background(repo_id: str, revision: str | None, on_disk: threading.Event) -> None:
    """Run in a daemon thread once the peer serves; logs what it did, never raises. Sets `on_disk`
    once every layer's files are in the HF cache: the balancer then stops waiting behind the peers
    that load from disk (peer/balancer.py react_delay's `downloads`)."""
    started = time.monotonic()
    logger.info("prefetching the weight files of every layer of %s into the HF cache, so later moves load "
                "from disk (--no-prefetch: off)", repo_id)
    try:
        done = prefetch_layers(repo_id, revision)
    except ResolveError as e:
        logger.warning("prefetch stopped: %s; later moves download their own layers", e)
        return
    except Exception:  # a background nicety must never take the peer down
        logger.exception("prefetch failed; later moves download their own layers")
        return
    if done.complete:
        on_disk.set()
    if done.skipped is not None:
        logger.info("not prefetching %s: %s; later moves %s", repo_id, done.skipped,
                    "load from disk" if done.complete else "download their own layers")
    else:
        logger.info("prefetched %s: all %d weight files are in the HF cache (%.1f s); moves load from disk",
                    repo_id, done.files, time.monotonic() - started)
