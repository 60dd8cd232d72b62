"""Session-scoped model fixtures: tiny random checkpoints and the SmolLM2 demo checkpoint.

Imported into tests/conftest.py with `from tests.fixtures_models import *`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tiny_models import VARIANTS, build_tiny_model

__all__ = ["demo_model", "tiny_model", "tiny_model_factory", "tiny_model_variant"]


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`factory(variant="llama", num_layers=4) -> Path`; each checkpoint is built once per session."""
    built: dict[tuple[str, int], Path] = {}

    def factory(variant: str = "llama", num_layers: int = 4) -> Path:
        key = (variant, num_layers)
        if key not in built:
            built[key] = build_tiny_model(tmp_path_factory.mktemp(f"tiny-{variant}-{num_layers}"), variant, num_layers)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_model(tiny_model_factory: Callable[..., Path]) -> Path:
    """A 4-layer llama (multi-head attention) checkpoint folder."""
    return tiny_model_factory("llama")


@pytest.fixture(scope="session", params=VARIANTS)
def tiny_model_variant(request: pytest.FixtureRequest, tiny_model_factory: Callable[..., Path]) -> Path:
    """Each tiny variant in turn: llama, gqa, tied, qwen2."""
    return tiny_model_factory(request.param)


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """SmolLM2-135M-Instruct as float32 safetensors (converted once into ~/.cache/layerswarm)."""
    from shards.demo_model import prepare_demo_model

    return prepare_demo_model()
