"""ARCHITECTURE.md's module map must match the modules' own docstrings (regenerate with
``python -m ci.module_map --write``)."""

from ci.module_map import ROOT, updated


def test_architecture_module_map_is_current():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    assert updated(text) == text, "ARCHITECTURE.md's module map is stale: run `python -m ci.module_map --write`"


def test_every_module_has_a_docstring_line():
    from ci.module_map import render

    missing = [line for line in render().splitlines() if line.endswith("(no docstring)")]
    assert not missing, "modules without a docstring:\n" + "\n".join(missing)
