"""What a reaction counts of a loader that downloads its layers.

A loader's record says `downloading` while the layers still to come fetch from the network (a Hub model whose
background prefetch is not done: a joiner, or a mover): seconds a layer, against a fraction of one from disk.
Balancing counts a loader at its whole target from its first announcement on, so peers reacting to a crash's
dark layers saw a downloading joiner that had taken them a second before counted there, went elsewhere, and left
the stretch to light at the network's pace (traced at 2,000 simulated peers: the max flow at 0 for 9 s and under
95% for 49, docs/balancing.md, forty-sixth session). A reaction (balance_check with periodic False) counts such a
loader, when its target holds a layer no GPU peer serves, only on the layers of its target it serves already; the
rest are dark to it, and the disk loaders refill them. A downloader on served layers counts at its target, as does
any downloader at a periodic check: it will get there, and where nothing is dark it is no hurry to beat (counted
out there too, reactions to thin layers doubled up on it: more moves, no more flow in the simulator).
"""

from __future__ import annotations

from dataclasses import replace

from swarm.types import LayerRange, PeerRecord, PeerState, SwarmView


def as_reactions_count(view: SwarmView, me: str) -> SwarmView:
    """`view` with every downloading GPU loader other than `me` whose target holds a layer no GPU peer serves
    counted on the layers of its target it serves (ONLINE there, no longer moving), or left out where it serves
    none of them yet."""
    dark = set(view.uncovered_layers(standbys=False))
    records: dict[str, PeerRecord] = {}
    for peer_id, r in view.records.items():
        target = r.moving_to or r.layers  # JOINING: `layers` is its target, none of it served yet
        if peer_id == me or not r.downloading or r.standby or dark.isdisjoint(range(target.start, target.end)):
            records[peer_id] = r
            continue
        start, end = max(r.layers.start, target.start), min(r.layers.end, target.end)
        if r.state is PeerState.ONLINE and start < end:
            records[peer_id] = replace(r, layers=LayerRange(start, end), moving_to=None, loading_order=None,
                                       downloading=False)
    return replace(view, records=records)
