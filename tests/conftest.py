"""Shared pytest fixtures: tiny checkpoints, the demo model, and process cleanup.

Fixtures that start processes live in `tests/swarm_processes.py`; model builders in
`tests/tiny_models.py`. Every process a fixture starts is stopped by its pid at teardown.
"""
from tests.fixtures_models import *  # noqa: F401,F403
from tests.fixtures_swarm import *  # noqa: F401,F403
from tests.swarm_processes import local_swarm  # noqa: F401
