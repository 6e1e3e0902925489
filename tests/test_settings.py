"""The settings module: one parser, and the docs' table in step with the declarations."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritoncomm import settings


def test_the_docs_table_lists_every_setting():
    doc = (Path(__file__).parent.parent / "docs" / "settings.md").read_text()
    assert settings.table() in doc, "docs/settings.md is out of step: paste settings.table() in"


def test_every_tritoncomm_variable_the_package_names_is_declared():
    import re

    root = Path(settings.__file__).parent
    named = {m for p in root.rglob("*.py") for m in re.findall(r"\bTRITONCOMM_[A-Z0-9_]+\b", p.read_text())}
    assert named <= {s.name for s in settings.SETTINGS}, named - {s.name for s in settings.SETTINGS}


@pytest.mark.parametrize("raw,want", [("1", True), ("ON", True), ("yes", True), ("0", False), ("off", False),
                                      ("", True), ("  ", True)])
def test_booleans(monkeypatch, raw, want):
    monkeypatch.setenv("TRITONCOMM_CHECK_CALLS", raw)
    assert settings.CHECK_CALLS.get() is want


def test_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("TRITONCOMM_ENABLE", "maybe")
    with pytest.raises(ValueError, match="TRITONCOMM_ENABLE"):
        settings.ENABLE.get()
    monkeypatch.setenv("TRITONCOMM_BACKEND_MAX_BYTES", "12Q")
    with pytest.raises(ValueError, match="TRITONCOMM_BACKEND_MAX_BYTES"):
        settings.BACKEND_MAX_BYTES.get()
    monkeypatch.setenv("TRITONCOMM_BACKEND_MAX_BYTES", "4096")
    assert settings.BACKEND_MAX_BYTES.get() == 4096


def test_environment_variables_are_read_only_here():
    """Reads of the environment live in ``settings``; elsewhere only writes, and saves marked as restored."""
    import re

    root = Path(settings.__file__).parent
    reads = re.compile(r"os\.getenv\(|os\.environ\.get\(|os\.environ\[[^]]+\](?!\s*=)|in os\.environ")
    found = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p.name != "settings.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if reads.search(line) and "restored" not in line]
    assert found == [], found


@pytest.mark.parametrize("raw,want", [("1", True), ("true", True), ("Y", True), ("0", False), ("", False),
                                      ("foo", False)])
def test_triton_interpret_is_read_by_tritons_rule(monkeypatch, raw, want):
    from tritoncomm.launch import detect_backend

    monkeypatch.setenv("TRITON_INTERPRET", raw)
    assert settings.triton_interprets() is want
    if want:
        assert detect_backend() == "cpu"
