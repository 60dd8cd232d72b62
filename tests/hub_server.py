"""A tiny stand-in for the Hugging Face Hub on 127.0.0.1, for `HF_ENDPOINT` in tests (no internet).

It answers the two endpoints `huggingface_hub.hf_hub_download` and `repo_info` use:
  HEAD/GET /{repo}/resolve/{revision}/{file}   headers X-Repo-Commit, ETag, Content-Length;
                                               404s carry X-Error-Code (RepoNotFound,
                                               RevisionNotFound, EntryNotFound) as the Hub does
  GET /api/models/{repo}/revision/{revision}   {"id", "sha", "siblings": [{"rfilename"}]}
and logs every request, so a test can assert which files a peer or client downloaded.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")


@dataclass
class HubRepo:
    folder: Path  # the files of the repo
    commit: str  # 40 hex digits
    branches: tuple[str, ...] = ("main",)

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*") if p.is_file())


@dataclass
class HubServer:
    repos: dict[str, HubRepo]
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def downloaded(self, repo_id: str) -> set[str]:
        """Files of `repo_id` whose bytes were sent (GET), not just asked about (HEAD)."""
        out = set()
        for method, path in self.requests:
            match = _RESOLVE.match(path)
            if method == "GET" and match and match["repo"] == repo_id:
                out.add(match["file"])
        return out

    def __enter__(self) -> HubServer:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet: the test reads hub.requests
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                hub.requests.append((self.command, self.path.split("?")[0]))
                path = self.path.split("?")[0]
                if match := _API.match(path):
                    repo = self._repo(match["repo"], match["rev"])
                    if repo is not None:
                        info = {"id": match["repo"], "sha": repo.commit,
                                "siblings": [{"rfilename": f} for f in repo.files()]}
                        self._send(200, json.dumps(info).encode(), body, {"Content-Type": "application/json"})
                    return
                match = _RESOLVE.match(path)
                if match is None:
                    return self._send(404, b"not found", body, {})
                repo = self._repo(match["repo"], match["rev"])
                if repo is None:
                    return
                file = repo.folder / match["file"]
                if ".." in match["file"] or not file.is_file():
                    return self._send(404, b"entry not found", body,
                                      {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit})
                data = file.read_bytes()
                etag = '"' + hashlib.sha256(data).hexdigest() + '"'
                self._send(200, data, body, {"X-Repo-Commit": repo.commit, "ETag": etag,
                                             "Content-Type": "application/octet-stream"})

            def _repo(self, repo_id: str, rev: str) -> HubRepo | None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._send(404, b"repo not found", self.command == "GET", {"X-Error-Code": "RepoNotFound"})
                elif rev not in (*repo.branches, repo.commit):
                    self._send(404, b"revision not found", self.command == "GET",
                               {"X-Error-Code": "RevisionNotFound"})
                    repo = None
                return repo

            def _send(self, code: int, data: bytes, body: bool, headers: dict[str, str]) -> None:
                self.send_response(code)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


def split_checkpoint(src: Path, dst: Path) -> dict[str, str]:
    """Copy a single-file checkpoint into `dst` as one safetensors file per layer plus one for the
    embeddings/norm/head, with a model.safetensors.index.json; returns the weight map."""
    dst.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(src / "model.safetensors"))
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = re.match(r"model\.layers\.(\d+)\.", name)
        key = f"layer{int(match.group(1)):03d}" if match else "head"
        groups.setdefault(key, {})[name] = tensor.contiguous()
    total, weight_map = len(groups), {}
    for i, key in enumerate(sorted(groups), start=1):
        file = f"model-{i:05d}-of-{total:05d}.safetensors"
        save_file(groups[key], str(dst / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in groups[key]})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": weight_map}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    for extra in src.iterdir():
        if extra.is_file() and not extra.name.endswith(".safetensors"):
            (dst / extra.name).write_bytes(extra.read_bytes())
    return weight_map
