"""The simulator's report: its result (SimResult), the printed table and the plot over time."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class SimResult:
    config: dict
    num_layers: int
    coverage_time_fraction: float  # share of time every layer had a serving peer (ONLINE, DRAINING or standby)
    uncovered_layer_time_fraction: float  # share of (layer x time) without one
    bottleneck_vs_bound_mean: float  # time-average of min per-layer ONLINE throughput / bound
    bottleneck_vs_bound_p10: float
    migrations_per_peer_hour: float
    joins: int
    departures: int
    migrations: int
    drains: int  # graceful departures
    drains_timed_out: int  # drains that left before their layers were covered
    drain_s_mean: float | None  # seconds from DRAINING to leaving
    flow_vs_bound_mean: float | None  # max flow of the ONLINE placement (+ streaming standbys) / capacity bound
    spread_vs_bound_mean: float | None  # flow the spread routes carry (flow_weights) / capacity bound
    load_spread_mean: float | None  # max / mean peer utilisation under the spread routes
    route_cost_s_mean: float | None
    route_hops_mean: float | None
    route_plan_ms_mean: float | None
    routes_failed: int
    # The initial peers' optimum lies in [low, high] x their capacity bound (benchmarks.sim_optimum.optimum_bracket).
    optimum_low_vs_bound: float
    optimum_high_vs_bound: float
    sole_servers_mean: float  # peers that are the only staying (ONLINE, not draining) server of a layer, time mean
    gaps_opened: int  # times some layer lost its last serving peer (standbys included)
    standby_only_time_fraction: float  # share of time some layer was served by standbys alone (slowly)
    standbys_mean: float  # standbys running, time mean
    standby_moves: int
    wall_s: float
    # Layers one crash from dark, each simulated minute: at most one staying GPU server and no
    # standby serving them yet (one loading does not count), time mean.
    exposed_layers_mean: float = 0.0
    # Layers two crashes from dark, sampled the same way: exactly two staying GPU servers and no standby
    # serving them (two failures inside one detection window darken them; --standby-pair-weight guards them).
    pair_exposed_layers_mean: float = 0.0
    moves_from_memory: int = 0  # moves that loaded layers their peer had read into memory (--pre-read)
    checks_as_reactions: int = 0  # periodic balance checks that saw a gap and decided as reactions, after their delay
    refills_past_downloads: int = 0  # reactions onto layers only downloading loaders held (downloads_count_as_dark)
    series: dict = field(default_factory=dict)


def format_table(r: SimResult) -> str:
    c = r.config
    rows = [
        ("peers / layers / redundancy", f"{c['peers']} / {r.num_layers} / {c['redundancy'] if not c['layers'] else 'n/a'}"),
        ("simulated hours (+ warm-up) / churn per hour", f"{c['hours']} (+ {c['warmup_hours']}) / {c['churn']:.0%}"),
        ("coverage (time all layers served)", f"{r.coverage_time_fraction:.4%}"),
        ("uncovered layer-time", f"{r.uncovered_layer_time_fraction:.5%}"),
        ("bottleneck / bound (mean, p10)", f"{r.bottleneck_vs_bound_mean:.1%}, {r.bottleneck_vs_bound_p10:.1%}"),
        ("migrations per peer per hour", f"{r.migrations_per_peer_hour:.3f} ({r.migrations} moves, "
                                         f"{r.moves_from_memory} from memory; {r.checks_as_reactions} periodic "
                                         f"checks on a gap decided as reactions, {r.refills_past_downloads} "
                                         f"refills of layers only downloads held)"),
        ("joins / departures (graceful, timed out)", f"{r.joins} / {r.departures} ({r.drains}, {r.drains_timed_out})"),
        ("drain time (mean)", "n/a" if r.drain_s_mean is None else f"{r.drain_s_mean:.0f} s"),
        ("max flow / bound; spread routes / bound", "n/a" if r.flow_vs_bound_mean is None else
         f"{r.flow_vs_bound_mean:.1%}; {r.spread_vs_bound_mean:.1%}"),
        ("optimum / bound, t=0 (bracket)", f"[{r.optimum_low_vs_bound:.1%}, {r.optimum_high_vs_bound:.1%}]"),
        ("max flow / optimum (bracket)", "n/a" if r.flow_vs_bound_mean is None else
         f"[{r.flow_vs_bound_mean / r.optimum_high_vs_bound:.1%}, {r.flow_vs_bound_mean / r.optimum_low_vs_bound:.1%}]"),
        ("load spread (max / mean utilisation)", "n/a" if r.load_spread_mean is None else f"{r.load_spread_mean:.2f}"),
        ("route cost s/token, hops (mean)",
         "n/a" if r.route_cost_s_mean is None else f"{r.route_cost_s_mean:.3f} s, {r.route_hops_mean:.1f} hops"),
        ("sole servers (mean peers) / gaps opened (mean s)",
         f"{r.sole_servers_mean:.1f} / {r.gaps_opened} ({_gap_s(r):.0f} s)"),
        ("exposed layers (one crash from dark, no ready standby; mean)", f"{r.exposed_layers_mean:.2f}"),
        ("pair-exposed layers (two servers, no ready standby; mean)", f"{r.pair_exposed_layers_mean:.1f}"),
        ("standbys (mean) / their moves / time served by standbys alone",
         f"{r.standbys_mean:.0f} / {r.standby_moves} / {r.standby_only_time_fraction:.3%}"),
        ("plan_route time (mean) / failed", f"{(r.route_plan_ms_mean or 0):.1f} ms / {r.routes_failed}"),
        ("wall time", f"{r.wall_s:.1f} s"),
    ]
    width = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{width}}  {b}" for a, b in rows)


def _gap_s(r: SimResult) -> float:
    """Mean seconds from a gap opening until every layer is served again."""
    seconds = (1.0 - r.coverage_time_fraction) * r.config["hours"] * 3600.0
    return seconds / r.gaps_opened if r.gaps_opened else 0.0


def plot(r: SimResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = r.series
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    axes[0].plot(s["t_h"], [100 * x for x in s["ratio"]])
    axes[0].axhline(80, color="grey", linestyle="--", linewidth=0.8)
    axes[0].set_ylabel("bottleneck / bound (%)")
    axes[0].set_ylim(0, 105)
    axes[1].plot(s["t_h"], s["uncovered_layers"], color="tab:red")
    axes[1].set_ylabel("uncovered layers")
    peers = r.config["peers"]
    axes[2].plot(s["t_h"], [m / peers for m in s["migrations"]], color="tab:green")
    axes[2].set_ylabel("moves per peer (cum.)")
    axes[2].set_xlabel("simulated hours")
    c = r.config
    if c["warmup_hours"]:
        for ax in axes:
            ax.axvline(c["warmup_hours"], color="grey", linestyle=":", linewidth=0.8)
        axes[0].text(c["warmup_hours"], 100, " measured from here", fontsize=8, va="top")
    fig.suptitle(f"{c['peers']} peers, {r.num_layers} layers, churn {c['churn']:.0%}/h, seed {c['seed']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
