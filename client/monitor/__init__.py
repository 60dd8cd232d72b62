"""`swarm-monitor`: a public health page for a layerswarm swarm (see docs/monitor.md).

Files and what each one owns:
  state.py      pure functions: DHT views + `info` answers -> the state dict (coverage, health, gaps, peers)
  collector.py  the network side: DHT reads, parallel `info` probes with timeouts, last good state when the DHT fails
  app.py        aiohttp routes: `/` page, `/api/v1/state` JSON, `/metrics`; strict query parsing, 404/400 pages
  page.py       server-side HTML rendering (every peer-supplied string html-escaped)
  assets.py     the page's inline CSS and refresh script (no CDN, works offline)
  metrics.py    Prometheus exposition from the state dict on a private CollectorRegistry
  cli.py        the `swarm-monitor` typer command

Dependencies: swarm (DHT, streams, plain types) only; never peer/.
"""
