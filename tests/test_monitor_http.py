"""HTTP behaviour of the monitor's routes over a fake collector: pages, JSON, 404 and 400 cases."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from client.monitor.app import make_app, parse_query
from client.monitor.collector import Collector
from client.monitor.state import Probe, build_state
from swarm.types import LayerRange, PeerRecord, SwarmView


class StaticCollector(Collector):
    """A collector whose state is set by the test; it never touches the network."""

    def __init__(self) -> None:
        record = PeerRecord(peer_id="p1", model="tiny", layers=LayerRange(0, 4), num_layers=4, public_name="<b>x</b>")
        views = [SwarmView("tiny", 4, {"p1": record})]
        super().__init__(node=None, probe=None, refresh=2.0, dht_timeout=1.0)  # type: ignore[arg-type]
        self.state = build_state(views, {"p1": Probe("p1", True, 0.003)}, 1e12, 2.0)  # far future: fresh


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(make_app(StaticCollector(), stale_after=30.0))) as c:
        yield c


async def test_page_and_state(client: TestClient) -> None:
    r = await client.get("/")
    assert r.status == 200 and r.content_type == "text/html"
    html = await r.text()
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    assert "script-src 'nonce-" in r.headers["Content-Security-Policy"]
    r = await client.get("/api/v1/state")
    assert r.status == 200
    state = await r.json()
    assert state["models"][0]["healthy"] is True and state["stale"] is False
    assert {"refreshed_at", "stale", "error", "age", "models", "version"} <= set(state)
    r = await client.get("/api/v1/state?model=tiny")
    assert r.status == 200 and [m["name"] for m in (await r.json())["models"]] == ["tiny"]
    r = await client.get("/?model=tiny")
    assert r.status == 200
    r = await client.get("/metrics")
    assert r.status == 200 and "layerswarm_monitor_model_healthy" in await r.text()


@pytest.mark.parametrize("path", ["/nope", "/api/v1/nope", "/index.html", "/api/v1/state/extra"])
async def test_unknown_paths_are_404(client: TestClient, path: str) -> None:
    r = await client.get(path)
    assert r.status == 404
    if path.startswith("/api/"):
        assert (await r.json())["error"]["status"] == 404
    else:
        assert "Not found" in await r.text() and r.content_type == "text/html"


async def test_unknown_model_is_404_with_its_name(client: TestClient) -> None:
    r = await client.get("/api/v1/state?model=%3Cnope%3E")
    assert r.status == 404 and "'<nope>'" in (await r.json())["error"]["message"]
    r = await client.get("/?model=%3Cnope%3E")
    assert r.status == 404 and "&lt;nope&gt;" in await r.text()


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("model", "does not parse"),
        ("model=", "needs a value"),
        ("model=%ff", "UTF-8"),
        ("model=%C3%28", "UTF-8"),
        ("colour=red", "unknown parameter"),
        ("model=a&model=b", "twice"),
        ("model=tiny&&", "does not parse"),
    ],
)
async def test_malformed_queries_are_400(client: TestClient, query: str, words: str) -> None:
    r = await client.get(f"/api/v1/state?{query}")
    assert r.status == 400
    assert words in (await r.json())["error"]["message"]
    r = await client.get(f"/?{query}")
    assert r.status == 400 and r.content_type == "text/html"


async def test_metrics_takes_no_parameters_and_post_is_405(client: TestClient) -> None:
    assert (await client.get("/metrics?x=1")).status == 400
    r = await client.post("/")
    assert r.status == 405 and "GET" in r.headers["Allow"]


def test_parse_query_limits() -> None:
    assert parse_query("", frozenset({"model"})) == {}
    assert parse_query("model=a%20b", frozenset({"model"})) == {"model": "a b"}
    with pytest.raises(ValueError, match="longer"):
        parse_query("model=" + "x" * 5000, frozenset({"model"}))
