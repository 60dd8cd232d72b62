"""Every bad `swarm-peer` command line: one line on stderr saying what to do, exit code 2, no traceback.

Checks that need nothing running are fast and run in parallel; each asserts that the peer
stopped before joining a swarm (no log line at all besides the error).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.hub_server import HubRepo, HubServer

UNREACHABLE = "/ip4/127.0.0.1/tcp/1/p2p/QmXBhWTUnBnYfWrN3NwVpNT3Sxp2B9t7iRCLaaBNGZBLdN"


def swarm_peer(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "peer.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def assert_one_line_error(proc: subprocess.CompletedProcess, *expected: str) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # nothing started, nothing logged: just the reason
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def in_process(capsys: pytest.CaptureFixture, *args: str) -> subprocess.CompletedProcess:
    """The CLI in this interpreter (a fresh one per case costs ~5 s of imports): same output, same code."""
    from peer.cli import app

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        app(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, exit_info.value.code, out.out, out.err)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--initial-peers", "/ip4/10.0.0.1/tcp/31337"], ["lacks the /p2p/<peer id> part"]),
        (["--layers", "3:1"], ["--layers", "need 0 <= start < end"]),
        (["--num-layers", "9"], ["--num-layers 9", "only 4 layers"]),
        (["--device", "tpu"], ["--device 'tpu' is not a torch device"]),
        (["--port", "70000"], ["--port 70000 is not a TCP port"]),
        (["--public-ip", "203.0.113.5"], ["--public-ip needs --port"]),
        (["--public-ip", "home", "--port", "31337"], ["--public-ip 'home' is not an IP address"]),
        (["--revision", "v1"], ["drop --revision"]),
        (["--quant", "int3"], ["--quant", "choose none, int8 or int4"]),
        (["--move-mode", "swap"], ["--move-mode", "choose auto, beside or in-place"]),
        (["--watch-period", "0"], ["--watch-period", "must be > 0 seconds"]),
        (["--standby", "--layers", "0:2"], ["--standby", "give --num-layers (or nothing), not --layers"]),
        (["--stream-weights"], ["--stream-weights", "add --device cuda"]),
    ],
)
def test_bad_serve_options(tiny_model: Path, capsys: pytest.CaptureFixture, args: list[str],
                           expected: list[str]) -> None:
    base = ["--model", str(tiny_model)] + ([] if "--layers" in args or "--num-layers" in args else ["--layers", "0:2"])
    assert_one_line_error(in_process(capsys, "serve", *base, *args), *expected)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["serve", "--model", "./no such folder", "--layers", "0:2"], ["not a local checkpoint folder nor a Hub repo id"]),
        (["serve", "--layers", "0:2"], ["Missing option '--model'"]),
        (["dht", "--initial-peers", "garbage"], ["is not a multiaddr"]),
        (["dht", "--host-maddrs", "tcp:1234"], ["--host-maddrs 'tcp:1234' is not a multiaddr"]),
    ],
)
def test_bad_command_lines_in_process(capsys: pytest.CaptureFixture, args: list[str], expected: list[str]) -> None:
    assert_one_line_error(in_process(capsys, *args), *expected)


def test_bad_command_lines_in_a_real_process(tiny_model: Path) -> None:
    """The issue's own examples, end to end: a fresh interpreter, its real stderr and exit code."""
    model = str(tiny_model)
    cases = [
        (["serve", "--model", model, "--layers", "0:2", "--initial-peers", "garbage"],
         ["--initial-peers 'garbage' is not a multiaddr", "copy the join line"]),
        (["serve", "--model", model, "--layers", "0:99"], ["--layers 0:99", "has 4 layers", "within 0:4"]),
    ]
    if not torch.cuda.is_available():
        cases.append((["serve", "--model", model, "--layers", "0:2", "--device", "cuda"],
                      ["--device cuda", "use --device cpu"]))
    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(lambda case: swarm_peer(*case[0]), cases))
    for (_args, expected), proc in zip(cases, results):
        assert_one_line_error(proc, *expected)


def test_identity_readable_by_others_and_too_long_a_ttl(tiny_model: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    key = tmp_path / "peer.key"
    serve = ["serve", "--model", str(tiny_model), "--layers", "0:2"]
    assert_one_line_error(in_process(capsys, *serve, "--announce-ttl", "7200"), "--announce-ttl", "3600")
    assert_one_line_error(in_process(capsys, *serve, "--identity", str(key), "--announce-ttl", "0"), "--announce-ttl")
    assert key.stat().st_mode & 0o777 == 0o600  # checked (and created) before the ttl was refused
    key.chmod(0o644)
    for command in (serve, ["dht"]):
        assert_one_line_error(in_process(capsys, *command, "--identity", str(key)), "readable by other users",
                              f"chmod 600 {key}")


def test_unknown_hub_repo_and_revision(tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with HubServer({"org/tiny": HubRepo(tiny_model, "0" * 40)}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)  # read at call time by shards.resolve
        monkeypatch.setenv("HF_HOME", str(tmp_path))
        missing = in_process(capsys, "serve", "--model", "org/nope", "--layers", "0:2")
        assert_one_line_error(missing, "'org/nope' at revision 'main': no such repo", "HF_TOKEN")
        revision = in_process(capsys, "serve", "--model", "org/tiny", "--revision", "v2", "--layers", "0:2")
        assert_one_line_error(revision, "'org/tiny' at revision 'v2': no such revision")
        out_of_range = in_process(capsys, "serve", "--model", "org/tiny", "--layers", "2:9")
        assert_one_line_error(out_of_range, "--layers 2:9: org/tiny has 4 layers")
        assert hub.downloaded("org/tiny") == {"config.json"}  # the range was checked before any weights


@pytest.mark.slow  # the p2p daemon gives up on the bootstrap peers after ~25 s
def test_unreachable_initial_peer(tiny_model: Path) -> None:
    proc = swarm_peer("serve", "--model", str(tiny_model), "--layers", "0:2", "--initial-peers", UNREACHABLE,
                      timeout=600)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("swarm-peer: error: cannot reach any initial peer") and "is running" in last
