"""Bad checkpoints fail with a CheckpointError naming the file or range; loading reads only what it needs."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import shards.loading
from shards import CheckpointError, ModelConfig, ModelHead, Shard, UnsupportedModelError
from shards.rotary import inverse_frequencies


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_layer_range_outside_model(tiny_model: Path) -> None:
    for start, end in [(0, 40), (3, 3), (-1, 2), (2, 1)]:
        with pytest.raises(CheckpointError, match=rf"{start}:{end}.*4 layers"):
            Shard.from_pretrained(tiny_model, start, end)


def test_missing_layer_tensor(tiny_model: Path, tmp_path: Path) -> None:
    model = copy_model(tiny_model, tmp_path / "m")
    tensors = load_file(model / "model.safetensors")
    del tensors["model.layers.2.mlp.up_proj.weight"]
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.mlp\.up_proj\.weight.*model\.safetensors"):
        Shard.from_pretrained(model, 1, 4)
    Shard.from_pretrained(model, 0, 2)  # layers that are complete still load


def test_folder_without_safetensors(tiny_model: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((tiny_model / "config.json").read_text())
    with pytest.raises(CheckpointError, match=rf"{tmp_path}.*no \*\.safetensors"):
        Shard.from_pretrained(tmp_path, 0, 1)
    with pytest.raises(CheckpointError, match="config.json"):
        Shard.from_pretrained(tmp_path / "nowhere", 0, 1)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda b: b[:8] + b"{not json" + b[17:],  # garbage JSON
        lambda b: (2**62).to_bytes(8, "little") + b[8:],  # absurd header length
        lambda b: b[:5],  # truncated inside the length field
    ],
    ids=["json", "length", "truncated-header"],
)
def test_corrupt_safetensors_header(tiny_model: Path, tmp_path: Path, corrupt) -> None:
    model = copy_model(tiny_model, tmp_path / "m")
    file = model / "model.safetensors"
    file.write_bytes(corrupt(file.read_bytes()))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*(corrupt|truncated)"):
        Shard.from_pretrained(model, 0, 2)


def test_truncated_tensor_data(tiny_model: Path, tmp_path: Path) -> None:
    model = copy_model(tiny_model, tmp_path / "m")
    file = model / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        Shard.from_pretrained(model, 0, 4)


def test_unsupported_model_type(tiny_model: Path, tmp_path: Path) -> None:
    model = copy_model(tiny_model, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, model_type="gpt2", architectures=["GPT2LMHeadModel"])))
    with pytest.raises(UnsupportedModelError, match="gpt2.*llama, mistral, qwen2"):
        Shard.from_pretrained(model, 0, 1)


def test_unsupported_rope_type(tiny_model: Path) -> None:
    config = ModelConfig.from_pretrained(tiny_model)
    with pytest.raises(UnsupportedModelError, match="mrope"):
        inverse_frequencies(dataclasses.replace(config, rope_scaling={"rope_type": "mrope", "factor": 4.0}))
    linear = dataclasses.replace(config, rope_scaling={"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(inverse_frequencies(linear), inverse_frequencies(config) / 4)


def test_config_parsing(tiny_model_factory) -> None:
    qwen = ModelConfig.from_pretrained(tiny_model_factory("qwen2"))
    assert qwen.model_type == "qwen2" and qwen.attention_bias and qwen.num_kv_heads == 2
    assert qwen.rope_theta == 1e6 and qwen.rope_scaling is None
    gqa = ModelConfig.from_pretrained(tiny_model_factory("gqa"))
    assert gqa.rope_scaling is not None and gqa.rope_scaling["rope_type"] == "llama3"
    tied = ModelConfig.from_pretrained(tiny_model_factory("tied"))
    assert tied.tie_word_embeddings and tied.head_dim == 48 and tied.num_kv_heads == 1


def test_loads_only_requested_layers(tiny_model_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tiny_model_factory("llama", 6)
    read: list[str] = []
    real_safe_open = shards.loading.safe_open

    class SpyOpen:
        def __init__(self, *args, **kwargs) -> None:
            self.inner = real_safe_open(*args, **kwargs)

        def __enter__(self):
            self.f = self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def get_tensor(self, name: str) -> torch.Tensor:
            read.append(name)
            return self.f.get_tensor(name)

    monkeypatch.setattr(shards.loading, "safe_open", SpyOpen)
    shard = Shard.from_pretrained(path, 0, 2)
    assert read and all(n.startswith(("model.layers.0.", "model.layers.1.")) for n in read)
    assert len(read) == 2 * 9
    assert {k.split(".")[1] for k in shard.state_dict()} == {"0", "1"}
    c = shard.config
    per_layer = 2 * c.hidden_size + (c.num_heads + 2 * c.num_kv_heads) * c.head_dim * c.hidden_size
    per_layer += c.num_heads * c.head_dim * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    assert sum(p.numel() for p in shard.parameters()) == 2 * per_layer

    read.clear()
    ModelHead.from_pretrained(path)
    assert sorted(read) == ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]


def test_sharded_checkpoint_with_index(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    a, b = Shard.from_pretrained(tiny_model, 1, 3), Shard.from_pretrained(tmp_path, 1, 3)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def test_fingerprint(tiny_model: Path, tmp_path: Path) -> None:
    f = Shard.from_pretrained(tiny_model, 0, 2).fingerprint
    assert len(f) == 64 and f == Shard.from_pretrained(tiny_model, 0, 2, dtype=torch.bfloat16).fingerprint
    assert f != Shard.from_pretrained(tiny_model, 0, 3).fingerprint
    # Same config, names and shapes, slightly different weights (a fine-tune): must differ too.
    model = copy_model(tiny_model, tmp_path / "m")
    tensors = load_file(model / "model.safetensors")
    tensors["model.layers.1.mlp.down_proj.weight"] *= 1.001
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    assert f != Shard.from_pretrained(model, 0, 2).fingerprint
    assert Shard.from_pretrained(tiny_model, 2, 4).fingerprint == Shard.from_pretrained(model, 2, 4).fingerprint
