"""Server-side HTML rendering of the monitor page (and its error pages).

Every string that came from a peer or the DHT goes through `esc` (html.escape, quotes too),
so a public name like `<script>` shows as text. Numbers are formatted here, never trusted raw.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from html import escape
from typing import Any

from client.monitor.assets import CSS, JS


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def fmt_num(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}".strip()


def fmt_rate(value: float | None) -> str:
    """Tokens per second: decimals only where they carry information."""
    return fmt_num(value, 0 if isinstance(value, (int, float)) and abs(value) >= 100 else 1)


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "never"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def cell_class(layer: Mapping[str, int]) -> str:
    online, joining = layer["online"], layer["joining"]
    if online == 0:
        return "cell join" if joining else "cell"  # JOINING alone does not cover, but is not a plain gap
    base = f"cell n{min(online, 3)}"
    return f"{base} withjoin" if joining else base


def coverage_bar(model: Mapping[str, Any]) -> str:
    cells = []
    for layer in model["layers"]:
        tip = f"layer {layer['index']}: {layer['online']} online"
        if layer["joining"]:
            tip += f", {layer['joining']} joining"
        cells.append(f'<div class="{cell_class(layer)}" title="{esc(tip)}"></div>')
    n = model["num_layers"]
    axis = f'<div class="axis"><span>layer 0</span><span>{n - 1 if n else 0}</span></div>'
    return f'<div class="bar" role="img" aria-label="layer coverage">{"".join(cells)}</div>{axis}'


LEGEND = (
    '<div class="legend"><span><i style="background:var(--c0)"></i>no peer</span>'
    '<span><i style="background:var(--c1)"></i>1 peer</span>'
    '<span><i style="background:var(--c2)"></i>2 peers</span>'
    '<span><i style="background:var(--c3)"></i>3+ peers</span>'
    '<span><i class="cell join"></i>gap, a peer is joining</span>'
    '<span><i class="cell n1 withjoin"></i>+ joining peers</span></div>'
)


def range_bar(layers: list[int], num_layers: int) -> str:
    start, end = layers
    n = max(num_layers, end, 1)
    left, width = 100 * start / n, 100 * (end - start) / n
    return (
        f'<div class="range" title="layers {start}:{end} of {n}">'
        f'<span style="left:{left:.2f}%;width:{width:.2f}%"></span></div>'
        f'<div class="rangetext">{start}:{end}</div>'
    )


def reach_cell(peer: Mapping[str, Any]) -> str:
    if peer["reachable"] is None:
        return '<span class="muted">probing…</span>'
    if peer["reachable"]:
        # A relayed peer (behind NAT) is reached through a circuit relay: slower, and worth fixing.
        return '<span class="ok">yes</span>' + (' <span class="muted">via relay</span>' if peer.get("relayed") else "")
    return f'<span class="bad">no</span><span class="err">{esc(peer["error"] or "")}</span>'


def state_pill(peer: Mapping[str, Any]) -> str:
    pill = f'<span class="pill {esc(peer["state"])}">{esc(peer["state"])}</span>'
    moving_to = peer.get("moving_to")
    if moving_to:
        pill += f' <span class="muted">moving to {int(moving_to[0])}:{int(moving_to[1])}</span>'
    if peer.get("standby"):
        pill += ' <span class="muted">standby</span>'
    return pill


def peer_row(peer: Mapping[str, Any], num_layers: int) -> str:
    name = peer["public_name"] or "(unnamed)"
    quant = "" if peer["quant"] in ("", "none") else f' / {esc(peer["quant"])}'
    pages = f'{fmt_num(peer["free_pages"], 0)} / {fmt_num(peer["total_pages"], 0)}'
    cells = [
        ("Name", "name wide", esc(name)),
        ("Peer", "mono", f'<span title="{esc(peer["peer_id"])}">…{esc(peer["short_id"])}</span>'),
        ("Layers", "", range_bar(peer["layers"], num_layers)),
        ("State", "", state_pill(peer)),
        ("Throughput", "num", fmt_rate(peer["throughput"]) + " tok/s"),
        ("Free KV pages", "num", pages),
        ("Dtype", "mono", esc(peer["dtype"]) + quant),
        ("Version", "mono", esc(peer["version"] or "—")),
        ("RTT", "num", fmt_num(peer["rtt_ms"], 1, "ms")),
        ("Reachable", "wide" if peer["reachable"] is False else "", reach_cell(peer)),
        ("Reports", "num", f'<span class="bad">{peer["reports"]}</span>' if peer.get("reports") else "0"),
    ]
    tds = "".join(f'<td class="{cls}" data-label="{label}">{html}</td>' for label, cls, html in cells)
    row_class = "peer down" if peer["reachable"] is False else "peer"
    return f'<tr class="{row_class}" data-peer="{esc(peer["peer_id"])}">{tds}</tr>'


HEADERS = ["Name", "Peer", "Layers", "State", "Throughput", "Free KV pages", "Dtype", "Version", "RTT", "Reachable",
           "Reports"]
NUMERIC = {"Throughput", "Free KV pages", "RTT", "Reports"}


def model_card(model: Mapping[str, Any]) -> str:
    healthy = model["healthy"]
    badge = '<span class="badge healthy">healthy</span>' if healthy else '<span class="badge broken">broken</span>'
    counts = model["peer_counts"]
    kpis = [
        (f'{model["coverage"] * 100:.0f}%', "layers covered"),
        (str(model["num_layers"]), "layers"),
        (f'{counts["serving"]} / {counts["total"]}', "peers serving"),
        (fmt_rate(model["throughput"]), "total tok/s"),
        (fmt_rate(model["bottleneck_throughput"]), "bottleneck tok/s"),
    ]
    kpi_html = "".join(f'<div class="kpi"><b>{esc(v)}</b><span>{label}</span></div>' for v, label in kpis)
    gaps = ""
    if model["gaps"]:
        spans = ", ".join(f"{a}:{b}" for a, b in model["gaps"])
        gaps = f'<p class="gaps">Uncovered layers: {esc(spans)}</p>'
    head = "".join(f'<th class="num">{h}</th>' if h in NUMERIC else f"<th>{h}</th>" for h in HEADERS)
    rows = "".join(peer_row(p, model["num_layers"]) for p in model["peers"])
    if not rows:
        rows = f'<tr><td colspan="{len(HEADERS)}" class="muted">no peers announced</td></tr>'
    return (
        f'<section class="card model" data-model="{esc(model["name"])}" data-healthy="{str(healthy).lower()}">'
        f'<div class="head"><h2>{esc(model["name"])}</h2>{badge}</div>'
        f'<div class="kpis">{kpi_html}</div>{coverage_bar(model)}{LEGEND}{gaps}'
        f'<div class="tablewrap"><table class="peers"><thead><tr>{head}</tr></thead>'
        f"<tbody>{rows}</tbody></table></div></section>"
    )


def content(state: Mapping[str, Any]) -> str:
    """The part of the page the script swaps in on every refresh."""
    age = state.get("age")
    parts = []
    if state.get("error"):
        parts.append(
            f'<div class="banner">Showing data from {esc(fmt_time(state.get("refreshed_at")))}: '
            f'the last refresh failed ({esc(state["error"])}).</div>'
        )
    for model in state["models"]:
        parts.append(model_card(model))
    if not state["models"]:
        waiting = state.get("refreshed_at") is None and not state.get("error")
        text = "Collecting the first view of the swarm…" if waiting else "No model is announced in the swarm."
        parts.append(f'<div class="card empty">{text}</div>')
    return (
        f'<div id="content" data-age="{"" if age is None else age}" '
        f'data-stale="{str(bool(state.get("stale"))).lower()}" '
        f'data-refresh="{esc(state["refresh_interval"])}">{"".join(parts)}</div>'
    )


def render_page(state: Mapping[str, Any], nonce: str, title_model: str | None = None) -> str:
    title = "layerswarm monitor" + (f" · {title_model}" if title_model else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title><style>{CSS}</style></head>
<body><header><h1>layerswarm <span>swarm monitor</span></h1>
<div id="status" class="status"><span class="dot"></span><span id="status-text">loading…</span></div></header>
<main>{content(state)}</main>
<footer>Data as JSON: <a href="/api/v1/state">/api/v1/state</a> · Prometheus: <a href="/metrics">/metrics</a></footer>
<script nonce="{esc(nonce)}">{JS}</script></body></html>"""


def render_error(status: int, title: str, message: str) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{status} {esc(title)}</title><style>{CSS}</style></head>
<body><header><h1>layerswarm <span>swarm monitor</span></h1></header>
<main><div class="card"><h2>{status} · {esc(title)}</h2><p>{esc(message)}</p>
<p><a href="/">Back to the swarm overview</a></p></div></main></body></html>"""
