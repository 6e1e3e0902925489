"""tritoncomm's requirements beside each engine, offline: pip must be able to install it next to vLLM
0.33.0 and SGLang 0.5.23 without changing their torch or Triton, on our GPU image's stack, and alone
on the newest torch. The engines' and torch's requirements below are copied from their published
wheels' metadata (read 2026-11-29)."""

from __future__ import annotations

import pathlib

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
from packaging.requirements import Requirement  # noqa: E402

#: Requires-Dist lines of each torch release (the ones that bear on us), from its Linux wheel.
TORCH_REQUIRES = {
    "2.11.0": ["triton==3.6.0; platform_system == 'Linux'", "cuda-bindings<14,>=13.0.3; platform_system == 'Linux'"],
    "2.12.0": ["triton==3.7.0; platform_system == 'Linux'", "cuda-bindings<14,>=13.0.3; platform_system == 'Linux'"],
    "2.13.0": ["triton==3.7.1; platform_system == 'Linux'", "cuda-bindings<14,>=13.0.3; platform_system == 'Linux'"],
    "2.14.0": ["triton~=3.8.0; platform_system == 'Linux'", "cuda-bindings<14,>=13.0.3; platform_system == 'Linux'"],
    "2.14.1": ["triton~=3.8.0; platform_system == 'Linux'", "cuda-bindings<14,>=13.0.3; platform_system == 'Linux'"],
    "2.15.0": ["triton~=3.9.0; platform_system == 'Linux'", "cuda-bindings<14,>=13.0.3; platform_system == 'Linux'"],
}

#: Requires-Dist lines of each engine that name what we require too.
ENGINE_REQUIRES = {
    "vllm==0.33.0": ["torch==2.14.0", "numpy"],
    "sglang==0.5.23": ["torch==2.14.1", "numpy", "cuda-python>=13.0"],
}

#: The stacks tritoncomm must install into unchanged: (name, engine, {package: version}).
STACKS = [
    ("vLLM 0.33.0", "vllm==0.33.0", {"torch": "2.14.0", "triton": "3.8.0", "numpy": "2.4.6", "cuda-python": "13.2.0"}),
    ("SGLang 0.5.23", "sglang==0.5.23",
     {"torch": "2.14.1", "triton": "3.8.0", "numpy": "2.4.6", "cuda-python": "13.2.0"}),
    ("our GPU image", None, {"torch": "2.11.0", "triton": "3.6.0", "numpy": "2.3.5", "cuda-python": "13.0.3"}),
    ("the newest torch", None, {"torch": "2.15.0", "triton": "3.9.0", "numpy": "2.4.6", "cuda-python": "13.2.0"}),
]

LINUX = {"platform_system": "Linux", "sys_platform": "linux", "python_version": "3.11", "extra": ""}


def _ours(extras: tuple[str, ...] = ("gpu",)) -> list[Requirement]:
    project = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(LINUX)]


def _admits(reqs: list[str | Requirement], name: str, version: str) -> bool:
    for r in reqs:
        r = Requirement(r) if isinstance(r, str) else r
        if r.name == name and (r.marker is None or r.marker.evaluate(LINUX)) and version not in r.specifier:
            return False
    return True


@pytest.mark.parametrize("stack", STACKS, ids=[s[0] for s in STACKS])
def test_requirements_admit_the_stack_unchanged(stack) -> None:
    name, engine, versions = stack
    # the stack is what its engine and its torch require (the test data hangs together)
    assert _admits(TORCH_REQUIRES[versions["torch"]], "triton", versions["triton"]), name
    if engine:
        for pkg, v in versions.items():
            assert _admits(ENGINE_REQUIRES[engine], pkg, v), (name, pkg)
    # and ours take every package of it as it is
    for pkg, v in versions.items():
        assert _admits(_ours(), pkg, v), (name, pkg, v, [str(r) for r in _ours()])


def test_alone_pip_may_take_the_newest_torch_and_every_triton_from_3_6() -> None:
    """No cap stops pip from choosing the newest torch (2.15.0, Triton 3.9) for a bare install, and
    every Triton a current torch requires is admitted."""
    for torch_version, reqs in TORCH_REQUIRES.items():
        assert _admits(_ours(), "torch", torch_version), torch_version
        triton = next(Requirement(r) for r in reqs if r.startswith("triton"))
        assert any(_admits(_ours(), "triton", v) for v in ("3.6.0", "3.7.0", "3.7.1", "3.8.0", "3.9.0")
                   if v in triton.specifier), torch_version


def test_no_exact_pin_and_every_cap_is_explained() -> None:
    """No ``==`` in the base requirements; a ``<`` (a cap) only with a comment on its line in
    pyproject.toml saying why."""
    text = (pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text()
    for r in _ours(extras=()):
        assert not any(s.operator in ("==", "===", "~=") for s in r.specifier), r
    lines = text[text.index("dependencies = ["):].split("]", 1)[0].splitlines()
    for line in lines:
        if "<" in line.split("#")[0] and '"' in line:
            assert "#" in line, line

