"""Build once, then reuse, the interop client's virtual environment `.venv-interop/` (gitignored).

The environment is keyed by the sha256 of tests/interop/requirements.txt: editing the pins
rebuilds it. A file lock keeps two test processes from building it at the same time.
`python tests/interop/venv.py` builds it and prints its interpreter (stdlib only, any Python >= 3.10).
`build_in_background()` starts that script early (tests/conftest.py does, when the interop test is
collected), so the ~2-3 minute build on a fresh clone overlaps other tests instead of adding to them.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
VENV = HERE.parent.parent / ".venv-interop"
BUILD_TIMEOUT = 900.0  # seconds for pip; py-libp2p and its dependencies take ~1 min on a fresh machine


class InteropUnavailable(RuntimeError):
    """The environment could not be built (no package index, no wheel for this Python, ...)."""


def _is_current(venv: Path) -> bool:
    stamp = venv / ".requirements-sha256"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    return (venv / "bin" / "python").exists() and stamp.exists() and stamp.read_text() == digest


def build_in_background(venv: Path = VENV) -> subprocess.Popen | None:
    """Start building the environment in another process (None: already built). `interop_python`
    then waits on the same lock; if this build fails it builds again and reports the error."""
    if venv != VENV or _is_current(venv):
        return None
    return subprocess.Popen([sys.executable, __file__], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def interop_python(venv: Path = VENV) -> Path:
    """The interpreter of the interop environment, built first if missing or built from other pins."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    python, stamp = venv / "bin" / "python", venv / ".requirements-sha256"
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(venv):
            return python
        shutil.rmtree(venv, ignore_errors=True)
        for command in ([sys.executable, "-m", "venv", str(venv)],
                        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                         "-r", str(REQUIREMENTS)]):
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise InteropUnavailable(f"{' '.join(command[:4])} ... took over {BUILD_TIMEOUT:g} s") from None
            if done.returncode != 0:
                errors = [line for line in done.stderr.splitlines() if "WARNING" not in line]
                shutil.rmtree(venv, ignore_errors=True)
                raise InteropUnavailable(f"{' '.join(command[:4])} ... failed: {' | '.join(errors[-3:])}")
        stamp.write_text(digest)
    return python


if __name__ == "__main__":
    print(interop_python())
