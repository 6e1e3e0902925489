"""The README's headline tables and docs/performance.md are generated from the committed results."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_generated_docs_are_up_to_date():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render_docs.py"), "--check"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readme_is_short_and_free_of_history():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for word in ("ses" "sion ", "Ses" "sion ", " ru" "n 1", " ru" "n 2"):  # split: this file has none either
        assert word not in text, word
