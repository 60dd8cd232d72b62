"""`swarm-peer generate`: stream a model's answer to a prompt through the swarm, in a terminal."""

from __future__ import annotations

import logging
import sys
import time
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt (for chat models it is sent as a user message).")],
    model: Annotated[str, typer.Option("--model", help="Local checkpoint folder or Hugging Face repo id (the client needs its embeddings, LM head and tokenizer; a repo's decoder layers are never downloaded).")],
    initial_peers: Annotated[list[str], typer.Option("--initial-peers", help="Multiaddr of any peer of the swarm (repeatable).")],
    model_name: Annotated[str | None, typer.Option(help="Name of the model in the DHT. Default: the repo id, or the folder's name.")] = None,
    revision: Annotated[str | None, typer.Option(help="With a Hub repo id: the branch, tag or commit to use (token from HF_TOKEN).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 128,
    do_sample: Annotated[bool, typer.Option("--sample/--greedy", help="Sample (with temperature, top-k, top-p) or pick the likeliest token.")] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.8,
    top_k: Annotated[int, typer.Option(help="Sample among the k likeliest tokens (0: all).")] = 50,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling: smallest set with this much probability.")] = 0.9,
    repetition_penalty: Annotated[float, typer.Option(help="Penalty for tokens already in the text (1.0: none).")] = 1.0,
    chat: Annotated[bool, typer.Option("--chat/--raw", help="Wrap the prompt in the tokenizer's chat template when it has one.")] = True,
    push: Annotated[bool, typer.Option("--push/--relay", help="Peers pass decode steps straight to each other (push) or through the client (relay).")] = True,
    device: Annotated[str | None, typer.Option(help="Where the client's embeddings, LM head and sampling run: cpu or cuda (cuda:N). Default: cuda when a GPU is present, else cpu.")] = None,
    log_level: Annotated[str, typer.Option(help="Logging level on stderr.")] = "warning",
) -> None:
    """Generate text from PROMPT through the swarm, printing tokens as they arrive."""
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.WARNING), stream=sys.stderr)
    import torch
    from transformers import TextStreamer

    from client import DistributedModel

    if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
        raise typer.BadParameter(f"{device!r}: this torch has no CUDA device; use --device cpu", param_hint="--device")
    started = time.perf_counter()
    lm = DistributedModel.from_pretrained(model, initial_peers, model_name=model_name, push=push, device=device,
                                          revision=revision)
    try:
        if lm.tokenizer is None:
            raise typer.BadParameter(f"{model} has no tokenizer; use the Python API with token ids", param_hint="--model")
        tok = lm.tokenizer
        if chat and tok.chat_template:
            ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                          return_tensors="pt")
            ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        else:
            ids = tok(prompt, return_tensors="pt").input_ids
        joined = time.perf_counter()
        out = lm.generate(
            ids, max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
            top_p=top_p, repetition_penalty=repetition_penalty, streamer=TextStreamer(tok, skip_prompt=True, skip_special_tokens=True),
        )
        done = time.perf_counter()
        new = out.shape[1] - ids.shape[1]
        per_token = (done - joined) / max(new, 1) * 1000
        print(f"\n[{new} tokens in {done - joined:.2f} s, {per_token:.0f} ms/token; joined the swarm in "
              f"{joined - started:.1f} s]", file=sys.stderr)
    finally:
        lm.close()


if __name__ == "__main__":
    app(prog_name="swarm-peer generate")  # reached through `swarm-peer generate` (peer/cli.py)
