"""``import tritoncomm`` registers the backend and loads nothing else: no Triton, no kernel, no
integration; every exported name still resolves, and ``init_process_group`` works right after it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

AFTER_IMPORT = """
import sys, torch, torch.distributed as dist
import tritoncomm
loaded = sorted(m for m in sys.modules if m.startswith("tritoncomm."))
assert "triton" not in sys.modules, "triton imported"
assert loaded == ["tritoncomm.config", "tritoncomm.errors", "tritoncomm.lazy", "tritoncomm.registration",
                  "tritoncomm.settings"], loaded
assert "TRITONCOMM" in dist.Backend._plugins
for name in tritoncomm.__all__:
    getattr(tritoncomm, name)
import tritoncomm.integrations as integ
assert not [m for m in sys.modules if m.startswith("tritoncomm.integrations.") and m.endswith(("vllm", "sglang"))]
for name in integ.__all__:
    getattr(integ, name)
assert tritoncomm.AllReduce is tritoncomm.collectives.allreduce.AllReduce
assert "AllReduce" in dir(tritoncomm) and "launch" in dir(tritoncomm)
print("ok")
"""

INIT = """
import sys, torch, torch.distributed as dist
import tritoncomm
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("cpu:tritoncomm", rank=rank, world_size=2, init_method="tcp://127.0.0.1:" + port)
x = torch.full((8,), float(rank + 1), dtype=torch.bfloat16)
dist.all_reduce(x)
pg = dist.group.WORLD
print(type(pg).__name__, pg.comm is not None, x.tolist() == [3.0] * 8)
dist.destroy_process_group()
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "TRITON_INTERPRET": "1"}


def test_import_loads_only_the_registration():
    out = subprocess.run([sys.executable, "-c", AFTER_IMPORT], env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_init_process_group_right_after_the_import():
    """In the CPU world (the ranks are fresh interpreters)."""
    from tritoncomm.kernels.interpreter import numpy_problem

    if numpy_problem():  # e.g. a GPU image's own Python: Triton 3.6 with NumPy 2.4 or later
        pytest.skip(numpy_problem())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", INIT, str(r), port], env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.split() == ["TritonCommProcessGroup", "True", "True"], err[-2000:]


def _imports(path: Path, module: str, is_package: bool) -> set[str]:
    """The tritoncomm modules ``module`` imports anywhere in its source (function-local imports too),
    except under ``if TYPE_CHECKING:``."""
    import ast

    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"
            for n in ast.walk(node)}
    package = module if is_package else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("tritoncomm")}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target.startswith("tritoncomm"):
                out.add(target)
                out |= {f"{target}.{a.name}" for a in node.names}  # "from . import x" names modules
    return out


def test_no_import_circle():
    """No module imports, even lazily, one that imports it back (through any chain), leaving aside a
    module's own package ``__init__`` files (which Python runs first anyway)."""
    modules = {}
    for p in (ROOT / "tritoncomm").rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = (p, is_package)
    graph = {}
    for name, (p, is_package) in modules.items():
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = {m for m in _imports(p, name, is_package) if m in modules and m != name and m not in ancestors}
    circles = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert circles == [], circles[:5]
