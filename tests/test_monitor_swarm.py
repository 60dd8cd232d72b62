"""The monitor against a real DHT and three real peers: JSON state, kills, metrics, and the page in Chromium.

One swarm per module (peers 0:2, 2:4, 2:4 of a 4-layer model, `--announce-ttl 4`) keeps the
run short. The tests run in file order: the read-only ones first, the one that kills peers last.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from client.local_swarm import LocalSwarm, SwarmProcess
from swarm.launcher import launched_env
from tests.polling import wait_for
from tests.swarm_processes import TEST_ENV, new_test_swarm

pytestmark = pytest.mark.slow

EVIL_NAME = "<script>alert(1)</script>"


class Monitor:
    """A `python -m client.monitor.cli` subprocess on a free port (--port 0, read from stdout)."""

    def __init__(self, initial_peer: str, log_path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "client.monitor.cli", "--initial-peers", initial_peer,
             "--port", "0", "--refresh", "1", "--rpc-timeout", "2", "--log-level", "debug"],
            stdout=subprocess.PIPE, stderr=open(log_path, "w"), stdin=subprocess.DEVNULL,  # noqa: SIM115
            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1", **launched_env(), **TEST_ENV),
            start_new_session=True,
        )
        self.log_path = log_path
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stdout], daemon=True).start()
        try:
            line = lines.get(timeout=60)
        except queue.Empty:
            self.stop()
            raise TimeoutError(f"monitor printed nothing in 60 s:\n{log_path.read_text()[-3000:]}") from None
        assert line.startswith("monitor: http://127.0.0.1:"), line
        self.url = line.split()[1]

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url.rstrip("/") + path, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def state(self) -> dict[str, Any]:
        status, body = self.get("/api/v1/state")
        assert status == 200, body
        return json.loads(body)

    def stop(self) -> int | None:
        """SIGTERM by pid (the clean path must exit 0); kill -9 it and its helpers if it hangs."""
        helpers = psutil.Process(self.proc.pid).children(recursive=True) if self.proc.poll() is None else []
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            for helper in helpers:
                if helper.is_running():
                    helper.kill()


def model_of(state: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((m for m in state["models"] if m["name"] == name), None)


@pytest.fixture(scope="module")
def swarm_and_monitor(tmp_path_factory: pytest.TempPathFactory, tiny_model_factory: Callable[..., Path]) -> Iterator[tuple[LocalSwarm, list[SwarmProcess], Monitor, str]]:
    model = tiny_model_factory("llama", 4)
    log_dir = tmp_path_factory.mktemp("monitor-swarm")
    with new_test_swarm(log_dir) as swarm:
        swarm.start_dht()
        ttl = ("--announce-ttl", "4")
        peers = [
            swarm.start_peer(model, "0:2", *ttl, "--public-name", EVIL_NAME, wait=False),
            swarm.start_peer(model, "2:4", *ttl, "--public-name", "alpha", wait=False),
            swarm.start_peer(model, "2:4", *ttl, "--public-name", "beta", wait=False),
        ]
        monitor = Monitor(swarm.initial_peers[0], log_dir / "monitor.log")  # starts while the peers load
        try:
            for peer in peers:
                swarm.wait_online(peer)
            yield swarm, peers, monitor, model.resolve().name
        finally:
            code = monitor.stop()
        assert code == 0, f"monitor did not exit 0 on SIGTERM:\n{monitor.log_path.read_text()[-3000:]}"


def full_and_healthy(monitor: Monitor, name: str) -> dict[str, Any] | None:
    m = model_of(monitor.state(), name)
    if m and m["healthy"] and m["peer_counts"]["serving"] == 3:
        return m
    return None


def test_state_shows_full_coverage(swarm_and_monitor: tuple) -> None:
    _, peers, monitor, name = swarm_and_monitor
    m = wait_for(lambda: full_and_healthy(monitor, name), 30, "three serving peers")
    assert m["coverage"] == 1.0 and m["gaps"] == [] and m["num_layers"] == 4
    assert [c["online"] for c in m["layers"]] == [1, 1, 2, 2]
    assert {p["peer_id"] for p in m["peers"]} == {p.peer_id for p in peers}
    assert all(p["reachable"] and p["rtt_ms"] > 0 and p["total_pages"] > 0 for p in m["peers"])
    assert m["throughput"] > 0
    state = monitor.state()
    assert state["stale"] is False and state["error"] is None and state["refreshed_at"] > 0


def test_metrics_parse(swarm_and_monitor: tuple) -> None:
    _, peers, monitor, name = swarm_and_monitor
    wait_for(lambda: full_and_healthy(monitor, name), 30, "three serving peers")
    status, text = monitor.get("/metrics")
    assert status == 200
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    coverage = [s for s in samples if s.name == "layerswarm_monitor_model_coverage_ratio" and s.labels["model"] == name]
    assert coverage and coverage[0].value == 1.0
    rtts = {s.labels["peer"] for s in samples if s.name == "layerswarm_monitor_peer_rtt_seconds"}
    assert rtts == {p.peer_id for p in peers}


def test_bad_requests_on_the_real_monitor(swarm_and_monitor: tuple) -> None:
    monitor = swarm_and_monitor[2]
    assert monitor.get("/no/such/page")[0] == 404
    assert monitor.get("/api/v1/state?model")[0] == 400
    assert monitor.get("/api/v1/state?model=%ff")[0] == 400
    assert monitor.get("/api/v1/state?model=nosuchmodel")[0] == 404


def test_page_in_chromium(swarm_and_monitor: tuple, chromium: Any, tmp_path: Path) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    _, _, monitor, name = swarm_and_monitor
    wait_for(lambda: full_and_healthy(monitor, name), 30, "three serving peers")
    driver = chromium
    driver.get(monitor.url)
    rows = wait_for(lambda: len(driver.find_elements(By.CSS_SELECTOR, "table.peers tr.peer")) == 3, 20, "3 table rows")
    assert rows
    card = driver.find_element(By.CSS_SELECTOR, f'section.model[data-model="{name}"]')
    assert card.find_element(By.CSS_SELECTOR, ".badge").text.strip().lower() == "healthy"
    assert len(card.find_elements(By.CSS_SELECTOR, ".bar .cell")) == 4
    assert EVIL_NAME in driver.find_element(By.TAG_NAME, "body").text  # shown as text, not run
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - reading it is how Selenium looks for an alert
    # The page refreshes itself: the status line comes from the script, not from the server.
    wait_for(lambda: "updated" in driver.find_element(By.ID, "status-text").text, 10, "status line")
    time.sleep(1.5)  # let one self-refresh swap the content in, then check it is still whole
    assert len(driver.find_elements(By.CSS_SELECTOR, "table.peers tr.peer")) == 3
    driver.save_screenshot(str(tmp_path / "monitor.png"))
    driver.set_window_size(390, 1400)
    driver.save_screenshot(str(tmp_path / "monitor-phone.png"))


def test_kills_thin_then_break_the_model(swarm_and_monitor: tuple) -> None:
    _, peers, monitor, name = swarm_and_monitor
    wait_for(lambda: full_and_healthy(monitor, name), 30, "three serving peers")
    first, second, third = peers
    third.kill()

    def thinner() -> dict[str, Any] | None:
        m = model_of(monitor.state(), name)
        if not m or [c["online"] for c in m["layers"]] != [1, 1, 1, 1]:
            return None
        gone = [p for p in m["peers"] if p["peer_id"] == third.peer_id]
        return m if not gone or gone[0]["reachable"] is False else None

    m = wait_for(thinner, 20, "the killed 2:4 peer to be unreachable or gone")
    assert m["healthy"] and m["coverage"] == 1.0
    dead = [p for p in m["peers"] if p["peer_id"] == third.peer_id]
    assert not dead or dead[0]["error"]

    first.kill()
    m = wait_for(lambda: (x := model_of(monitor.state(), name)) and x["gaps"] == [[0, 2]] and x, 20, "a gap at 0:2")
    assert m["healthy"] is False and m["coverage"] == 0.5
    assert monitor.state()["stale"] is False  # the DHT is fine; only peers died
