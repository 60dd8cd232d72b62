"""The simulator's standby round without an O(layers) pass per standby.

At each read of the view every ready standby asks routing.standby.standby_window where it should be.
That call builds the whole model's exposure with the standby itself left out of its own layers' guards
and its host's layers zeroed, then scores every window: O(layers) per standby, so a 2,000-peer swarm
(10,504 layers, about 600 standbys) spends most of its run there once some window is always worth a
move (--standby-pair-weight: unguarded two-server layers everywhere).

StandbyScores scores the windows once per round on the exposure with every standby counted (per
window size) and answers each standby exactly as standby_window would: its own weights differ from
that exposure only on its own window and its host's layers, so only the windows that touch those are
scored again, and the best of the rest is the round's best window if one of its ties lies outside
them (else it falls back to standby_window itself). The same answer as standby_window whenever window
sums are exact in floating point, as they are for weights that are multiples of a power of two
(EXPOSED_GAP, 1, and pair weights such as 0.25 or 0.5); tests/test_sim_standby_round.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from routing.standby import STANDBY_MARGIN, exposure, layer_exposure, standby_window
from swarm.types import LayerRange


class StandbyScores:
    """standby_window for many standbys on one view (`servers`, `guarded`: per layer, every standby counted)."""

    def __init__(self, servers: Sequence[int], guarded: Sequence[int], sizes: Iterable[int],
                 pair_weight: float = 0.0) -> None:
        self.servers, self.guarded, self.pair_weight = servers, guarded, pair_weight
        self.total = len(servers)
        prefix = [0.0]
        for value in exposure(servers, guarded, pair_weight):
            prefix.append(prefix[-1] + value)
        self.best: dict[int, float] = {}  # per window size: the best score of any window (a bound on any move)
        self._best_starts: dict[int, list[int]] = {}  # ... and the starts of the windows that reach it, ascending
        for k in set(sizes):
            k = min(k, self.total)
            scores = [prefix[s + k] - prefix[s] for s in range(self.total - k + 1)]
            self.best[k] = top = max(scores)
            self._best_starts[k] = [s for s, score in enumerate(scores) if score == top]

    def window_for(self, k: int, current: LayerRange, hosted: Sequence[LayerRange], idle_moves: bool = False
                   ) -> LayerRange | None:
        """standby_window(servers, guarded less this standby on its own non-hosted layers, k, current, useless =
        the `hosted` spans, pair_weight, idle_moves): where a standby of k layers on `current`, counted in
        `guarded`, should move, or None to stay."""
        total, servers = self.total, self.servers
        k = min(k, total)
        if k not in self.best:
            raise ValueError(f"no window of {k} layers was scored this round")
        own = range(current.start, min(current.end, total))
        in_host = set()
        for span in hosted:
            in_host.update(range(max(span.start, 0), min(span.end, total)))

        def weight(layer: int) -> float:
            if layer in in_host:
                return 0.0
            return layer_exposure(servers[layer], self.guarded[layer] - (layer in own), self.pair_weight)

        if any(servers[i] == 0 and not self.guarded[i] - (i not in in_host) for i in own):
            return None
        # The starts whose windows touch a layer weighed otherwise than in the round's exposure.
        touched: list[tuple[int, int]] = []
        for span in sorted([own, *(range(max(s.start, 0), min(s.end, total)) for s in hosted)], key=lambda r: r.start):
            if len(span) == 0:
                continue
            lo, hi = max(0, span.start - k + 1), min(total - k, span.stop - 1)
            if lo > hi:
                continue
            if touched and lo <= touched[-1][1] + 1:
                touched[-1] = (touched[-1][0], max(touched[-1][1], hi))
            else:
                touched.append((lo, hi))
        best_score, best = None, None
        for lo, hi in touched:
            running = [0.0]
            for layer in range(lo, hi + k):
                running.append(running[-1] + weight(layer))
            for s in range(lo, hi + 1):
                score = running[s - lo + k] - running[s - lo]
                if best_score is None or score > best_score:
                    best_score, best = score, s
        outside = next((s for s in self._best_starts[k] if not any(lo <= s <= hi for lo, hi in touched)), None)
        if outside is None:
            # Every window outside scores under the round's best; unless a touched one reaches it, one of
            # them may still beat the touched ones: score them all.
            if best_score is None or best_score < self.best[k]:
                return self._slow(k, current, in_host, idle_moves)
        elif best_score is None or self.best[k] > best_score or (self.best[k] == best_score and outside < best):
            best_score, best = self.best[k], outside
        here = sum(weight(layer) for layer in own)
        margin = 1.0 if idle_moves and here == 0 else max(1.0, STANDBY_MARGIN * k)
        if best_score < here + margin:
            return None
        return LayerRange(best, best + k)

    def _slow(self, k: int, current: LayerRange, in_host: set[int], idle_moves: bool) -> LayerRange | None:
        """standby_window itself (every window scored): when no window of the round's best lies clear of this one's."""
        others = list(self.guarded)
        for layer in range(current.start, min(current.end, self.total)):
            others[layer] -= layer not in in_host
        useless = [layer in in_host for layer in range(self.total)]
        return standby_window(self.servers, others, k, current, useless, self.pair_weight, idle_moves)
