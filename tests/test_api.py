"""`swarm-api` against a real DHT, two real peers and the official `openai` client; the page in Chromium.

One swarm per module: a 2-layer random llama that carries SmolLM2's tokenizer and chat template
(real text handling, fast steps), peers 0:1 and 1:2 (`--announce-ttl 4`), the gateway as a
`python -m client.api.cli` subprocess with an API key, and an in-process `DistributedModel` for
reference outputs and for reading the peers' pools. Tests run in file order; the last kills a peer.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from client.api.process import GatewayProcess
from client.local_swarm import LocalSwarm, SwarmProcess
from client.model import DistributedModel
from tests.polling import wait_for
from tests.swarm_processes import TEST_ENV, new_test_swarm
from tests.tiny_models import tiny_config

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.slow, pytest.mark.demo_model]

KEY = "sk-test-0123456789"


def build_chat_model(path: Path, tokenizer_source: Path) -> Path:
    """A seeded 2-layer random llama with the tokenizer (and chat template) of `tokenizer_source`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_source)
    config = tiny_config("llama", 2)
    config.vocab_size = len(tok)
    config.bos_token_id, config.eos_token_id, config.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
            else:
                p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


class Gateway(GatewayProcess):
    """`swarm-api` with an API key file, plus the two ways the tests talk to it."""

    def __init__(self, model: Path, initial_peer: str, key_file: Path, log_path: Path) -> None:
        super().__init__(model, initial_peer, log_path, "--api-key-file", str(key_file), "--log-level", "debug",
                         env=TEST_ENV)
        assert self.url.startswith("http://127.0.0.1:"), self.url

    def request(self, method: str, path: str, body: Any = None, key: str | None = KEY,
                raw: bytes | None = None) -> tuple[int, dict[str, str], str]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    def client(self, key: str = KEY) -> Any:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)


@dataclass
class Api:
    swarm: LocalSwarm
    peers: list[SwarmProcess]
    gateway: Gateway
    model: DistributedModel
    path: Path
    name: str

    def pools(self) -> dict[str, tuple[int, int]]:
        """Per peer: (free KV pages, open sessions)."""
        out = {}
        for peer in self.peers:
            reply = self.model.loop.run(self.model.swarm.peer_info(peer.peer_id), timeout=30)
            out[peer.peer_id] = (reply["record"]["free_pages"], reply["stats"]["sessions"])
        return out

    def chat_ids(self, messages: list[dict[str, str]]) -> torch.Tensor:
        ids = self.model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]  # (1, T)

    def reference(self, messages: list[dict[str, str]], max_tokens: int) -> str:
        """The same greedy chat through DistributedModel directly (its own chat-template path)."""
        ids = self.chat_ids(messages)
        out = self.model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        return self.model.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def serving(api: Api) -> bool:
    status, _, body = api.gateway.request("GET", "/v1/models")
    return status == 200 and [m["id"] for m in json.loads(body)["data"]] == [api.name]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[Api]:
    root = tmp_path_factory.mktemp("api")
    model = build_chat_model(root / "tinychat", demo_model)
    (root / "keys").write_text(f"# test keys\n{KEY}\n")
    with new_test_swarm(root / "logs") as swarm:
        swarm.start_dht()
        ttl = ("--announce-ttl", "4")
        peers = [swarm.start_peer(model, r, *ttl, wait=False) for r in ("0:1", "1:2")]
        gateway = Gateway(model, swarm.initial_peers[0], root / "keys", root / "logs" / "api.log")
        lm = None
        try:
            lm = DistributedModel.from_pretrained(model, swarm.initial_peers)  # needs the DHT only: joins while peers load
            for peer in peers:
                swarm.wait_online(peer)
            ctx = Api(swarm, peers, gateway, lm, model, model.name)
            wait_for(lambda: serving(ctx), 30, "the model in /v1/models")
            yield ctx
        finally:
            if lm is not None:
                lm.close()
            code = gateway.stop()
        assert code == 0, f"swarm-api did not exit 0 on SIGTERM:\n{gateway.log_tail()}"


MESSAGES = [{"role": "user", "content": "Name three colours."}]


def test_models_and_health(api: Api) -> None:
    models = api.gateway.client().models.list()
    assert [m.id for m in models.data] == [api.name] and models.data[0].owned_by == "layerswarm"
    status, _, body = api.gateway.request("GET", "/health", key=None)  # open without a key
    assert status == 200 and json.loads(body)["status"] == "ok"


def test_chat_equals_generate_streaming_or_not(api: Api) -> None:
    client = api.gateway.client()
    whole = client.chat.completions.create(model=api.name, messages=MESSAGES, max_tokens=12, temperature=0)
    expected = api.reference(MESSAGES, 12)
    assert whole.choices[0].message.content == expected and whole.choices[0].message.role == "assistant"
    prompt_len = api.chat_ids(MESSAGES).shape[1]
    assert whole.usage.prompt_tokens == prompt_len and whole.usage.completion_tokens == 12
    assert whole.usage.total_tokens == prompt_len + 12 and whole.choices[0].finish_reason == "length"
    assert "<|im" not in expected  # special tokens never leak

    chunks = list(client.chat.completions.create(model=api.name, messages=MESSAGES, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == expected and len(deltas) >= 6  # about one chunk per token
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_streaming_or_not(api: Api) -> None:
    client = api.gateway.client()
    whole = client.completions.create(model=api.name, prompt="The capital of France is", max_tokens=10, temperature=0)
    ids = api.model.tokenizer("The capital of France is", return_tensors="pt").input_ids
    out = api.model.generate(ids, max_new_tokens=10, do_sample=False)
    expected = api.model.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert whole.choices[0].text == expected and whole.object == "text_completion"
    assert whole.usage.prompt_tokens == ids.shape[1] and whole.usage.completion_tokens == 10
    stream = client.completions.create(model=api.name, prompt="The capital of France is", max_tokens=10,
                                       temperature=0, stream=True)
    texts, reasons = [], []
    for chunk in stream:
        texts.append(chunk.choices[0].text)
        reasons.append(chunk.choices[0].finish_reason)
    assert "".join(texts) == expected and reasons[-1] == "length" and set(reasons[:-1]) == {None}
    # Token ids as the prompt give the same answer.
    same = client.completions.create(model=api.name, prompt=ids[0].tolist(), max_tokens=10, temperature=0)
    assert same.choices[0].text == expected


def test_seeded_sampling_repeats(api: Api) -> None:
    client = api.gateway.client()
    runs = [client.chat.completions.create(model=api.name, messages=MESSAGES, max_tokens=8, temperature=1.0,
                                           top_p=0.9, seed=seed).choices[0].message.content for seed in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_stop_strings(api: Api) -> None:
    client = api.gateway.client()
    full = api.reference(MESSAGES, 16)
    words = full.split()
    assert len(words) >= 4, full
    stop = words[2]  # a word from the middle of the greedy answer
    cut = full[: full.index(stop)]
    whole = client.chat.completions.create(model=api.name, messages=MESSAGES, max_tokens=16, temperature=0,
                                           stop=[stop, "never-appears"])
    assert whole.choices[0].message.content == cut and whole.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens < 16
    chunks = list(client.chat.completions.create(model=api.name, messages=MESSAGES, max_tokens=16, temperature=0,
                                                 stop=stop, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == cut and chunks[-1].choices[0].finish_reason == "stop"
    # The Python client's generate(stop=...) ends at the token that completes the stop string.
    tok, ids = api.model.tokenizer, api.chat_ids(MESSAGES)
    out = api.model.generate(ids, max_new_tokens=16, do_sample=False, stop=stop)
    new = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert stop in new and new.startswith(cut) and out.shape[1] - ids.shape[1] == whole.usage.completion_tokens
    assert stop not in tok.decode(out[0, ids.shape[1]:-1], skip_special_tokens=True)


def test_sixteen_concurrent_streams_equal_single_runs(api: Api) -> None:
    prompts = [[{"role": "user", "content": f"Tell me about the number {i}."}] for i in range(16)]
    singles = [api.reference(p, 8) for p in prompts]
    barrier = threading.Barrier(16)

    def stream(messages: list[dict[str, str]]) -> str:
        client = api.gateway.client()
        barrier.wait(30)
        chunks = client.chat.completions.create(model=api.name, messages=messages, max_tokens=8, temperature=0,
                                                stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    with ThreadPoolExecutor(16) as pool:
        outputs = list(pool.map(stream, prompts))
    assert outputs == singles
    assert len(set(singles)) > 1  # different prompts, different answers: the sessions did not mix


def test_disconnect_mid_stream_frees_every_pool(api: Api) -> None:
    before = api.pools()
    assert all(sessions == 0 for _, sessions in before.values()), before
    client = api.gateway.client()
    stream = client.chat.completions.create(model=api.name, messages=MESSAGES, max_tokens=200, temperature=0,
                                            stream=True)
    got = 0
    for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got >= 3:
            break
    during = api.pools()
    assert all(sessions == 1 for _, sessions in during.values()), during  # one session on each peer
    stream.close()  # the client goes away mid-stream
    wait_for(lambda: api.pools() == before, 20, f"peer pools back to {before}")
    status, _, text = api.gateway.request("GET", "/metrics", key=None)
    aborted = [s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "layerswarm:request_aborted_total"]
    assert aborted == [1.0]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": "nope"}, "model", "unknown model 'nope'"),
        ({"temperature": "hot"}, "temperature", "must be a number"),
        ({"max_tokens": 2.5}, "max_tokens", "must be an integer"),
        ({"messages": "hi"}, "messages", "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "must be one of"),
        ({"n": 2}, "n", "only n=1"),
        ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
        ({"stop": ["a", 3]}, "stop", "list of strings"),
        ({"max_tokens": 300}, "max_tokens", "maximum context length is 256 tokens"),
        ({"messages": [{"role": "user", "content": "word " * 300}]}, "messages", "maximum context length is 256"),
        ({"frobnicate": True}, "frobnicate", "unrecognized request argument"),
    ],
)
def test_bad_requests_are_400(api: Api, body: dict[str, Any], param: str, words: str) -> None:
    full = {"model": api.name, "messages": MESSAGES, **body}
    status, _, text = api.gateway.request("POST", "/v1/chat/completions", full)
    error = json.loads(text)["error"]
    assert status == 400 and words in error["message"] and error["param"] == param
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


def test_other_errors_in_openai_shape(api: Api) -> None:
    gw = api.gateway
    status, _, text = gw.request("POST", "/v1/chat/completions", raw=b"{not json")
    assert status == 400 and "not valid JSON" in json.loads(text)["error"]["message"]
    for key in (None, "sk-wrong"):
        status, _, text = gw.request("POST", "/v1/chat/completions", {"model": api.name, "messages": MESSAGES}, key=key)
        assert status == 401 and json.loads(text)["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        gw.client("sk-wrong").models.list()
    status, _, text = gw.request("GET", "/v1/nothing")
    assert status == 404 and json.loads(text)["error"]["message"].startswith("there is nothing")
    status, headers, _ = gw.request("GET", "/v1/chat/completions")
    assert status == 405 and "POST" in headers["Allow"]
    with pytest.raises(openai.BadRequestError, match="unknown model"):  # the SDK reads our error shape
        gw.client().completions.create(model="nope", prompt="x", max_tokens=2)


def test_metrics_count_requests(api: Api) -> None:
    status, headers, text = api.gateway.request("GET", "/metrics", key=None)
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    label = (("model_name", api.name),)
    assert samples[("layerswarm:time_to_first_token_seconds_count", label)] >= 20
    assert samples[("layerswarm:time_per_output_token_seconds_count", label)] >= 100
    assert samples[("layerswarm:e2e_request_latency_seconds_count", label)] >= 20
    assert samples[("layerswarm:generation_tokens_total", label)] >= 200
    assert samples[("layerswarm:prompt_tokens_total", label)] >= 400
    assert samples[("layerswarm:num_requests_running", label)] == 0
    assert samples[("layerswarm:num_requests_waiting", label)] == 0
    assert samples[("layerswarm:request_failure_total", (*label, ("status", "400")))] >= 11


def test_chat_page_in_chromium(api: Api, chromium: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = chromium
    driver.set_window_size(1100, 800)
    driver.get(api.gateway.url + "/")
    css = driver.find_elements  # shorthand
    # A key is needed: the page asks for it after /v1/models answers 401.
    key = wait_for(lambda: (k := driver.find_element(By.ID, "key")).is_displayed() and k, 15, "the key field")
    key.send_keys(KEY)
    driver.execute_script("document.getElementById('key').dispatchEvent(new Event('change'))")
    wait_for(lambda: driver.find_element(By.ID, "model").get_attribute("value") == api.name, 15, "the model list")
    driver.find_element(By.ID, "max").clear()
    driver.find_element(By.ID, "max").send_keys("12")

    def say(text: str, count: int) -> Any:
        driver.find_element(By.ID, "input").send_keys(text)
        driver.find_element(By.ID, "send").click()
        return wait_for(lambda: len(done := css(By.CSS_SELECTOR, '.assistant[data-state="done"]')) == count and done[-1],
                        60, f"answer {count}")

    def answer(index: int) -> str:  # the bubble's text node (its meta line is a child element)
        return driver.execute_script(f"return document.querySelectorAll('.assistant')[{index}].firstChild.textContent")

    first = say("Name three colours.", 1)
    expected = api.reference(MESSAGES, 12)
    assert answer(0) == expected and "tokens/s" in first.text and "length" in first.text
    say("And three animals?", 2)  # the second turn carries the whole history
    history = [*MESSAGES, {"role": "assistant", "content": expected}, {"role": "user", "content": "And three animals?"}]
    assert answer(1) == api.reference(history, 12)
    # Stop: a long answer, cancelled from the page; the peers' pools drain.
    driver.find_element(By.ID, "max").clear()
    driver.find_element(By.ID, "max").send_keys("120")  # the history + 120 stay within the 256-token context
    driver.find_element(By.ID, "input").send_keys("Count to one hundred.")
    driver.find_element(By.ID, "send").click()
    # Click Stop from a script the moment text streams in: a WebDriver round trip per poll could miss it.
    stop_when_streaming = """const stop = document.getElementById('stop'), a = document.querySelectorAll('.assistant');
        if (!stop.hidden && a.length === 3 && a[2].firstChild && a[2].firstChild.textContent) { stop.click(); return true; }
        return false;"""
    wait_for(lambda: driver.execute_script(stop_when_streaming), 30, "the third answer to stream")
    third = wait_for(lambda: len(d := css(By.CSS_SELECTOR, '.assistant[data-state="done"]')) == 3 and d[-1], 15,
                     "the stopped answer")
    assert "stopped" in third.text and not css(By.CSS_SELECTOR, ".error")
    wait_for(lambda: all(s == 0 for _, s in api.pools().values()), 20, "sessions closed after Stop")
    # Kept where people look at results (gitignored), not in pytest's short-lived tmp dirs.
    shots = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    shots.mkdir(exist_ok=True)
    driver.save_screenshot(str(shots / "api-chat.png"))
    driver.set_window_size(390, 844)
    driver.save_screenshot(str(shots / "api-chat-phone.png"))


def test_no_route_is_503_with_retry_after(api: Api) -> None:
    api.peers[1].kill()  # layers 1:2 are gone; its record expires after --announce-ttl
    wait_for(lambda: not serving(api), 30, "the model to leave /v1/models")
    status, headers, text = api.gateway.request("POST", "/v1/chat/completions",
                                                {"model": api.name, "messages": MESSAGES, "max_tokens": 4})
    assert status == 503 and int(headers["Retry-After"]) > 0
    assert json.loads(text)["error"]["code"] == "no_route"
    status, _, text = api.gateway.request("GET", "/health", key=None)
    assert status == 503 and json.loads(text)["status"] == "unavailable"


def test_busy_peers_are_429_with_retry_after(api: Api) -> None:
    # Layers 1:2 come back on a peer that takes one session at a time; this test holds that one.
    peer = api.swarm.start_peer(api.path, "1:2", "--announce-ttl", "4", "--max-sessions", "1")
    wait_for(lambda: serving(api), 30, "the model back in /v1/models")
    with api.model.inference_session(max_length=8) as held:
        api.model.generate(api.chat_ids(MESSAGES)[:, :4], max_new_tokens=1, session=held)
        status, headers, text = api.gateway.request("POST", "/v1/chat/completions",
                                                    {"model": api.name, "messages": MESSAGES, "max_tokens": 4})
    assert status == 429 and int(headers["Retry-After"]) > 0, text
    error = json.loads(text)["error"]
    assert error["code"] == "peers_busy" and "too many open sessions" in error["message"]
    peer.kill()
