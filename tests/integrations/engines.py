"""The engines' own code for the integration tests: vLLM and SGLang at the versions pinned in
``engines-requirements.txt``, without their compiled extensions, with what their imports need.

``python -m tests.integrations.engines`` fetches them (``scripts/test.sh`` does): each engine's wheel
with ``pip download --no-deps``, unpacked without its shared libraries (``*.so``), and the packages
in ``engines-deps.txt`` with ``pip install --no-deps --target``. The result is cached under
``$TRITONCOMM_ENGINES_CACHE`` (default ``~/.cache/tritoncomm/engines``), in a folder named by a hash
of both files, so a pin change fetches afresh. ``paths()`` returns the folders to put on ``sys.path``
(or None when not fetched).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "engines-requirements.txt"
DEPS = HERE / "engines-deps.txt"
#: A compiled extension's file name: left out of what is unpacked and packed.
SHARED_LIBRARY = re.compile(r"\.so(\.[0-9.]+)?$")


def pins(path: Path) -> list[str]:
    """The ``name==version`` lines of a requirements file, comments dropped."""
    return [ln.split("#")[0].strip() for ln in path.read_text().splitlines() if ln.split("#")[0].strip()]


def cache_key(python: str = sys.version[:4]) -> str:
    """The cache folder's name: a hash of both pin files and the Python version (``"3.11"``)."""
    return hashlib.sha256((REQUIREMENTS.read_text() + DEPS.read_text() + python).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    root = Path(os.environ.get("TRITONCOMM_ENGINES_CACHE", Path.home() / ".cache" / "tritoncomm" / "engines"))
    return root / cache_key()


def paths() -> list[str] | None:
    """``[engines' source, their dependencies]`` if fetched, else None."""
    d = cache_dir()
    return [str(d / "src"), str(d / "deps")] if (d / "COMPLETE").exists() else None


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True)


def fetch() -> list[str]:
    """Fetch into the cache unless already there; return ``paths()``."""
    d = cache_dir()
    if (d / "COMPLETE").exists():
        return paths()  # type: ignore[return-value]
    d.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fetch-", dir=d.parent))
    try:
        wheels = work / "wheels"
        _pip("download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *pins(REQUIREMENTS))
        for whl in sorted(wheels.glob("*.whl")):
            with zipfile.ZipFile(whl) as z:
                z.extractall(work / "src", [m for m in z.namelist() if not SHARED_LIBRARY.search(m)])
        shutil.rmtree(wheels)
        _pip("install", "--no-deps", "--no-compile", "--target", str(work / "deps"), "-r", str(DEPS))
        (work / "COMPLETE").write_text("\n".join(pins(REQUIREMENTS) + pins(DEPS)) + "\n")
        if d.exists():
            shutil.rmtree(d)
        work.rename(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return paths()  # type: ignore[return-value]


if __name__ == "__main__":
    print("\n".join(fetch()))
