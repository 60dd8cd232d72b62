"""The installed distribution declares every third-party module our packages import at run time.

Read from the INSTALLED metadata (`importlib.metadata`), not from pyproject.toml, so the test
checks what `pip install .` would actually give a user; a stale editable install is reported
with the command that refreshes it.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("swarm", "peer", "shards", "routing", "client", "kernels")
# Imported only inside a guard that works without them; each with the reason it is optional.
OPTIONAL = {
    "triton": "kernels/_triton.py imports it in try/except: the GPU kernels exist only where CUDA torch ships it",
}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _runtime_requirements() -> list[Requirement]:
    """Requirements of the installed layerswarm that apply without extras."""
    reqs = [Requirement(r) for r in metadata.requires("layerswarm") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def _third_party_imports() -> dict[str, set[str]]:
    """top-level module -> files importing it, over every module of our packages (lazy imports too)."""
    ours = set(PACKAGES) | {"__future__"}
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for file in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text(), str(file))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ours:
                        found.setdefault(top, set()).add(str(file.relative_to(ROOT)))
    return found


def test_installed_metadata_is_current() -> None:
    """pyproject's dependencies and the installed metadata agree (else the other tests check stale data)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    installed = [str(r) for r in _runtime_requirements()]
    assert sorted(map(str, map(Requirement, declared))) == sorted(installed), (
        "the installed layerswarm metadata is stale: run `.venv/bin/pip install -e . --no-deps`"
    )


def test_no_other_installed_distribution_ships_our_package_names() -> None:
    # transformers 5.25 pulled in Hugging Face's `kernels`, which installs a top-level `kernels` as
    # ours does: one overwrites the other's files, and transformers imported ours and failed.
    clashes = {name: sorted(set(found) - {"layerswarm"})
               for name, found in metadata.packages_distributions().items() if name in PACKAGES}
    clashes = {name: others for name, others in clashes.items() if others}
    assert not clashes, (f"installed distributions ship our package names: {clashes}; pin the "
                         "dependency that pulls them in (pyproject.toml) and reinstall: make venv")


def test_every_runtime_import_is_declared() -> None:
    declared = {_canonical(r.name) for r in _runtime_requirements()}
    providers = metadata.packages_distributions()
    missing = []
    for module, files in sorted(_third_party_imports().items()):
        if module in OPTIONAL:
            continue
        dists = {_canonical(d) for d in providers.get(module, [])}
        if not dists:
            missing.append(f"{module} (imported by {sorted(files)[0]}) is not installed at all")
        elif not dists & declared:
            missing.append(f"{module} (imported by {sorted(files)[0]}) comes from {sorted(dists)}, not declared")
    assert not missing, "undeclared runtime dependencies:\n" + "\n".join(missing)
    assert {"psutil", "cryptography", "huggingface-hub"} <= declared  # the ones issue 16 found missing


def test_optional_imports_are_guarded() -> None:
    """Each module in OPTIONAL is really imported only inside try/except ImportError."""
    for module in OPTIONAL:
        for file in _third_party_imports().get(module, ()):
            tree = ast.parse((ROOT / file).read_text())
            guarded = {
                id(inner)
                for node in ast.walk(tree) if isinstance(node, ast.Try)
                for stmt in node.body for inner in ast.walk(stmt)
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Import | ast.ImportFrom) and module in ast.unparse(node).split()[1].split("."):
                    assert id(node) in guarded, f"{file}: `{ast.unparse(node)}` is not inside try/except"


def _declared_closure() -> set[str]:
    """Canonical names of every installed distribution a `pip install .` (no extras) would bring."""
    todo, seen = ["layerswarm"], set()
    while todo:
        name = todo.pop()
        if _canonical(name) in seen:
            continue
        seen.add(_canonical(name))
        for req in map(Requirement, metadata.requires(name) or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                try:
                    metadata.distribution(req.name)
                except metadata.PackageNotFoundError:
                    continue  # a requirement for another platform, absent here
                todo.append(req.name)
    return seen


def _site_with_only(dists: set[str], site: Path) -> None:
    """Fill `site` with links to the installed files (modules and metadata) of just `dists`."""
    for dist in metadata.distributions():
        if _canonical(dist.metadata["Name"]) not in dists or _canonical(dist.metadata["Name"]) == "layerswarm":
            continue
        base = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or []}:
            if top not in ("..", "__pycache__") and (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)


# A fresh `pip install .` (no extras) gives exactly the closure of our declared requirements.
# Building one needs the network and minutes; instead a child interpreter runs without
# site-packages (-S) on a folder linking only that closure's installed files (metadata
# included, so libraries probing for optional packages see them absent, as after a clean
# install). It imports every module of ours and runs a peer's --dry-run. Lazy imports inside
# functions are covered by the AST test above.
_CHILD = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    for package in PACKAGES:
        for info in pkgutil.walk_packages([package], prefix=package + "."):
            importlib.import_module(info.name)
    from peer.cli import app
    app(["serve", "--model", sys.argv[1], "--layers", "0:2", "--dry-run"])
    """
)


@pytest.mark.slow
def test_declared_closure_is_enough_to_run(tiny_model: Path, tmp_path: Path) -> None:
    closure = _declared_closure()
    assert {"torch", "hivemind", "psutil", "huggingface-hub"} <= closure
    assert "pytest" not in closure and "selenium" not in closure  # dev extras stay out
    _site_with_only(closure, tmp_path)
    code = _CHILD.replace("PACKAGES", repr(PACKAGES))
    env = {"PYTHONPATH": f"{ROOT}:{tmp_path}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(tiny_model)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "layers" in proc.stdout.lower()


def test_version_option() -> None:
    proc = subprocess.run([sys.executable, "-m", "peer.cli", "--version"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"layerswarm {metadata.version('layerswarm')}"
