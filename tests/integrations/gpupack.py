"""The engines' code packed for a GPU machine that cannot fetch it (no package index there).

The pack is the cache folder ``engines.fetch()`` makes, rebuilt for another Python (the GPU image's
3.12) and cut to fit a device call's carry limit:

* the engines' source: every ``.py`` file of vLLM and SGLang, their metadata, the kernel sources
  SGLang's GPU path looks for (``JIT_SOURCES``), and their other files that the CPU world's engine
  tests loaded;
* their dependencies: every distribution of which those tests loaded a file, whole. One built for
  a single Python version comes as the same version's wheel for the target Python instead, unless
  the GPU image has the package (``ON_GPU_IMAGE``), whose own build is then used.

``scripts/engines_gpu_pack.sh`` runs the CPU-world engine tests with ``tests/integrations/trace`` on
the path (it lists what each process loaded) and then this module:
``python -m tests.integrations.gpupack LOADED_DIR OUT.tar.xz [--python 3.12]``. On the GPU machine,
unpack it into a folder and point ``TRITONCOMM_ENGINES_CACHE`` at that folder.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from . import engines

#: Compiled distributions the GPU image already has (the device's KINDS.md package list): its own
#: builds are used there instead of carrying wheels.
ON_GPU_IMAGE = frozenset({"aiohttp", "frozenlist", "multidict", "propcache", "yarl", "pillow", "pyyaml", "regex",
                          "uvloop", "safetensors", "tokenizers", "psutil"})
#: Source trees the engines compile from at run time on GPUs, which the CPU world never loads.
JIT_SOURCES = ("sglang/kernels/jit/",)
_PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_26_x86_64",
              "manylinux_2_27_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_5_x86_64",
              "manylinux1_x86_64")


def _dists(deps: Path) -> dict[str, tuple[str, str, bool, list[str]]]:
    """Per installed distribution (its dist-info folder): name, version, whether its build is for
    one Python version, and the files its RECORD lists."""
    out = {}
    for info in sorted(deps.glob("*.dist-info")):
        meta = (info / "METADATA").read_text(errors="replace").splitlines()
        name = next(ln.split(":", 1)[1].strip() for ln in meta if ln.startswith("Name:"))
        version = next(ln.split(":", 1)[1].strip() for ln in meta if ln.startswith("Version:"))
        wheel = (info / "WHEEL").read_text().splitlines()
        tags = [ln.split(":", 1)[1].strip() for ln in wheel if ln.startswith("Tag:")]
        per_python = any(t.split("-")[1].startswith("cp3") for t in tags)
        with open(info / "RECORD", newline="") as f:
            files = [row[0] for row in csv.reader(f) if row]
        out[info.name] = (name, version, per_python, files)
    return out


def _loaded(trace: Path, root: Path) -> set[str]:
    """The files under ``root`` that any traced process loaded, relative to it."""
    seen = set()
    for listing in trace.glob("*.txt"):
        for line in listing.read_text().splitlines():
            p = Path(line)
            if p.is_relative_to(root):
                seen.add(str(p.relative_to(root)))
    return seen


def pack(trace: Path, out: Path, python: str = "3.12") -> None:
    """Build the pack for ``python`` into ``out`` (a ``.tar.xz``) from the traces in ``trace``."""
    src, deps = (Path(p) for p in engines.fetch())
    work = Path(tempfile.mkdtemp(prefix="gpupack-"))
    try:
        top = work / engines.cache_key(python)
        used_src = _loaded(trace, src)
        for f in src.rglob("*"):
            rel = str(f.relative_to(src))
            keep = f.suffix == ".py" or rel in used_src or ".dist-info/" in rel or rel.startswith(JIT_SOURCES)
            if f.is_file() and keep and not engines.SHARED_LIBRARY.search(rel):
                (top / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, top / "src" / rel)
        used = _loaded(trace, deps)
        wheels = []
        for name, version, per_python, files in _dists(deps).values():
            if not used.intersection(files):
                continue
            if per_python:
                if name.lower() not in ON_GPU_IMAGE:
                    wheels.append(f"{name}=={version}")
                continue
            if name.lower() in ON_GPU_IMAGE:
                continue
            for rel in files:
                f = deps / rel
                if f.is_file() and "__pycache__" not in rel:
                    (top / "deps" / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, top / "deps" / rel)
        pydir = work / "wheels"
        if wheels:
            plat = [a for p in _PLATFORMS for a in ("--platform", p)]
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", python, "--implementation", "cp", *plat, "-d", str(pydir), *wheels],
                           check=True)
            for whl in sorted(pydir.glob("*.whl")):
                with zipfile.ZipFile(whl) as z:
                    z.extractall(top / "deps")
        (top / "COMPLETE").write_text(f"packed for Python {python}: {len(wheels)} wheels\n" + "\n".join(wheels) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:xz") as t:
            t.add(top, arcname=top.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path, help="the folder of loaded-file lists (tests/integrations/trace)")
    ap.add_argument("out", type=Path, help="the .tar.xz to write")
    ap.add_argument("--python", default="3.12", help="the target machine's Python version")
    a = ap.parse_args()
    pack(a.trace, a.out, a.python)
    print(f"{a.out}: {a.out.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
