"""`DistributedModel`: a causal LM whose decoder layers live on swarm peers.

The client holds the tokenizer, embeddings, final norm and LM head; everything between goes
through an `InferenceSession` (generation) or stateless `forward` calls (scoring).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from client.config import ClientConfig
from client.forward import forward_through_swarm
from client.generation import run_generation, strip_left_padding
from client.loop import LoopThread
from client.sampling import SamplingParams, TokenChooser
from client.session import InferenceSession
from client.speculative import GenerationStats
from client.swarm_client import SwarmClient
from shards.config import ModelConfig
from shards.head import ModelHead
from shards.resolve import resolve_for_client

logger = logging.getLogger(__name__)


@dataclass
class CausalLMOutput:
    logits: torch.Tensor  # (B, T, V)


def load_tokenizer(path: Path) -> Any | None:
    """The checkpoint's tokenizer, or None when the folder has none (token ids still work)."""
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_generation_defaults(path: Path) -> Any | None:
    if not (path / "generation_config.json").exists():
        return None
    from transformers import GenerationConfig

    return GenerationConfig.from_pretrained(path)


def choose_device(
    device: str | torch.device | None, dtype: torch.dtype | None, model_config: ModelConfig
) -> tuple[torch.device, torch.dtype]:
    """Where the client's head runs: CUDA in the checkpoint's dtype when there is a GPU, else CPU float32.

    The head (embeddings, final norm, LM head) costs one vocab-sized matmul per token: on a CPU
    that is milliseconds, on a GPU microseconds. float32 stays the CPU default (bf16 matmuls are
    slow on most CPUs); an explicit `dtype` always wins.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was asked for but this torch has no CUDA device; use device='cpu'")
    if dtype is None:
        dtype = torch.float32
        if device.type == "cuda":
            dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(model_config.torch_dtype, torch.float32)
    return device, dtype


class DistributedModel:
    def __init__(
        self,
        path: Path,
        config: ClientConfig,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Prefer `DistributedModel.from_pretrained`."""
        self.path = path
        self.config = config
        self.model_config = ModelConfig.from_pretrained(path)
        self.device, self.dtype = choose_device(device, dtype, self.model_config)
        self.head = ModelHead.from_pretrained(path, dtype=self.dtype, device=self.device)
        self.tokenizer = load_tokenizer(path)
        self.generation_defaults = load_generation_defaults(path)
        self.model_name = config.model_name or path.resolve().name
        self.loop = LoopThread()
        try:
            self.swarm = SwarmClient(config, self.model_name, self.model_config.num_layers, self.loop)
        except BaseException:
            self.loop.stop()
            raise
        self.last_session: InferenceSession | None = None
        self.last_stats: GenerationStats | None = None  # set by every `generate`

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        initial_peers: list[str] | tuple[str, ...] = (),
        *,
        model_name: str | None = None,
        config: ClientConfig | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        revision: str | None = None,
        **config_overrides: Any,
    ) -> DistributedModel:
        """Join the swarm with the checkpoint folder's head, tokenizer and config.

        `device`/`dtype` place the client's head (embeddings, final norm, LM head) and sampling:
        default CUDA in the checkpoint's dtype when a GPU is present, else CPU float32.

        `path` is a local checkpoint folder or a Hub repo id (`revision`: branch, tag or commit):
        the client needs the config, tokenizer, embeddings and LM head (a few hundred MB at most),
        never the decoder layers, and downloads only the files holding those (shards/resolve.py).
        The model's name in the swarm defaults to the repo id (or the folder's name).
        """
        if not initial_peers and not (config and config.initial_peers):
            raise ValueError("initial_peers is empty: pass the multiaddr of any peer of the swarm")
        source = resolve_for_client(str(path), revision)  # ResolveError: one line naming repo and fix
        config = config or ClientConfig()
        config = replace(
            config,
            initial_peers=tuple(initial_peers) or config.initial_peers,
            model_name=model_name or config.model_name or source.default_name,
            **config_overrides,
        )
        return cls(source.path, config, device=device, dtype=dtype)

    # -- sessions ---------------------------------------------------------------------------------
    def inference_session(self, max_length: int, batch: int = 1, push: bool | None = None) -> InferenceSession:
        """A session that keeps its KV cache on the peers across `generate(..., session=...)` calls.

        `push` (default: the client config's) lets peers pass decode steps straight to each other.
        """
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        return InferenceSession(self.swarm, max_length, batch, push)

    # -- forward (scoring) ----------------------------------------------------------------------------
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> CausalLMOutput:
        """One stateless forward pass through the swarm; logits (B, T, V) like transformers.

        Left-padded positions get zero logits (they are never sent to the peers).
        """
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        seqs = strip_left_padding(input_ids, attention_mask)
        if any(not s for s in seqs):
            raise ValueError("every sequence needs at least one token")
        ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
        hidden = self.head.embed(ids).to("cpu", torch.float32)  # (N, H)
        new_tokens = [len(s) for s in seqs]
        out = self.loop.run(forward_through_swarm(self.swarm, hidden, new_tokens), timeout=None)
        logits_flat = self.head.logits(out).float()  # (N, V)
        B, T = input_ids.shape
        logits = torch.zeros(B, T, logits_flat.shape[-1])
        for b, rows in enumerate(torch.split(logits_flat, new_tokens)):
            logits[b, T - rows.shape[0] :] = rows
        return CausalLMOutput(logits=logits)

    # -- generation ---------------------------------------------------------------------------------
    def _default(self, name: str, value: Any, fallback: Any) -> Any:
        if value is not None:
            return value
        if self.generation_defaults is not None and getattr(self.generation_defaults, name, None) is not None:
            return getattr(self.generation_defaults, name)
        return fallback

    def _eos_ids(self, eos_token_id: int | list[int] | None) -> tuple[int, ...]:
        eos = self._default("eos_token_id", eos_token_id, None)
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        max_new_tokens: int = 20,
        min_new_tokens: int = 0,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        streamer: Any = None,
        session: InferenceSession | None = None,
        generator: torch.Generator | None = None,
        speculative: str | Path | Any | None = None,
        num_draft_tokens: int | None = None,
        stop: str | list[str] | None = None,
    ) -> torch.Tensor:
        """Like transformers' `generate`: returns (B, T + new) with the prompt (padding kept) first.

        With `session=`, the prompt continues that session's text (its earlier tokens stay cached
        on the peers), so multi-turn chats pay only for the new tokens.

        `speculative="prompt_lookup"` or a draft checkpoint folder (a small causal LM with the same
        tokenizer) drafts tokens on the client and verifies several per swarm step (batch of one
        only): greedy output is identical to plain greedy, sampled output has the same
        distribution. `num_draft_tokens` fixes the draft length; None adapts it (see
        client/speculative.py). `self.last_stats` tells what the call did.

        `stop` (a string or a list): a sequence ends once its new text contains one of them; the
        tokens up to the one that completes it are returned (like transformers' `stop_strings`).
        """
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        eos = self._eos_ids(eos_token_id)
        params = SamplingParams(
            do_sample=bool(self._default("do_sample", do_sample, False)),
            temperature=float(self._default("temperature", temperature, 1.0)),
            top_k=int(self._default("top_k", top_k, 50)),
            top_p=float(self._default("top_p", top_p, 1.0)),
            repetition_penalty=float(self._default("repetition_penalty", repetition_penalty, 1.0)),
            min_new_tokens=min_new_tokens,
            eos_token_ids=eos,
        )
        pad = pad_token_id if pad_token_id is not None else self._default("pad_token_id", None, None)
        if pad is None:
            pad = eos[0] if eos else 0
        return run_generation(
            self, input_ids, attention_mask, TokenChooser(params, generator), max_new_tokens=max_new_tokens,
            pad_token_id=int(pad), streamer=streamer, session=session,
            speculative=speculative, num_draft_tokens=num_draft_tokens, stop=stop,
        )

    def chat(self, messages: list[dict[str, str]], *, max_new_tokens: int = 128, **kwargs: Any) -> str:
        """Reply to a chat (a list of {"role", "content"}) with the tokenizer's chat template."""
        if self.tokenizer is None:
            raise ValueError(f"{self.path} has no tokenizer; chat needs one")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        if not isinstance(ids, torch.Tensor):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        out = self.generate(ids, max_new_tokens=max_new_tokens, **kwargs)
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    def close(self) -> None:
        self.swarm.close()
        self.loop.stop()

    def __enter__(self) -> DistributedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
