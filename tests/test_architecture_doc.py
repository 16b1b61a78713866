"""docs/architecture.md names every module, with the sentence its docstring opens with."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_module_is_in_architecture_doc():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    skip = {"__init__.py", "__main__.py", "version.py"}
    missing = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "folio").rglob("*.py"))
        if p.name not in skip and f"`{p.relative_to(ROOT)}`" not in doc
    ]
    assert not missing, f"run `python scripts/architecture_doc.py > docs/architecture.md`; missing: {missing}"
