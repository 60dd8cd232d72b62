"""Shared pytest fixtures: tiny checkpoints, the demo model, and process cleanup.

Fixtures that start processes live in `tests/swarm_processes.py`; model builders in
`tests/tiny_models.py`; the headless browser in `tests/fixtures_browser.py`. Every process a fixture starts is stopped by its pid at teardown.
When the interop test is collected, its virtual environment starts building in the background
at once (tests/interop/venv.py), so a fresh clone does not wait for it in that test's setup.
"""

import os
import signal
import subprocess

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning. The tests run torch in
# this process beside several peer processes on 2 cores; spinning threads there made a SmolLM2
# reference generation 7-9x slower (180 s vs 20 s, measured under the suite's load).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from tests.fixtures_browser import chromium  # noqa: E402,F401
from tests.fixtures_models import *  # noqa: E402,F401,F403
from tests.fixtures_swarm import *  # noqa: E402,F401,F403
from tests.interop.venv import build_in_background  # noqa: E402
from tests.swarm_processes import local_swarm, log_tails  # noqa: E402,F401

_INTEROP_BUILD = pytest.StashKey[subprocess.Popen]()


def pytest_collection_finish(session: pytest.Session) -> None:
    if any("interop_venv" in getattr(item, "fixturenames", ()) for item in session.items):
        build = build_in_background()
        if build is not None:
            session.config.stash[_INTEROP_BUILD] = build


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201 - a hook wrapper
    """A failed test that ran a `local_swarm` gets its processes' last log lines in its report."""
    outcome = yield
    report = outcome.get_result()
    swarm = getattr(item, "funcargs", {}).get("local_swarm")
    if report.when == "call" and report.failed and swarm is not None:
        report.sections.append(("peer and DHT logs (last lines of each)", log_tails(swarm)))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A build still running (the interop test was not reached) is stopped; the next run starts over."""
    build = session.config.stash.get(_INTEROP_BUILD, None)
    if build is not None and build.poll() is None:
        os.killpg(build.pid, signal.SIGTERM)  # its own process group: the script and its pip
        build.wait(30)
