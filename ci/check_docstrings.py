"""Docs coverage of the plugin contract: every public class, function, method and property in
``tokenmill.plugin_api`` and its submodules and subpackages has a docstring (plugin authors read the
contract, not our minds)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from ci.source_tree import ROOT

PLUGIN_API = Path("core/src/tokenmill/plugin_api")


def _public(name: str) -> bool:
    return not name.startswith("_")


def missing_docstrings(path: Path, root: Path) -> list[str]:
    """Public definitions in one file that lack a docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(root).as_posix()
    found = []
    if ast.get_docstring(tree) is None:
        found.append(f"{where}: module has no docstring")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(node.name):
            if ast.get_docstring(node) is None:
                found.append(f"{where}:{node.lineno}: function {node.name} has no docstring")
        elif isinstance(node, ast.ClassDef) and _public(node.name):
            if ast.get_docstring(node) is None:
                found.append(f"{where}:{node.lineno}: class {node.name} has no docstring")
            for member in node.body:
                if (isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(member.name)
                        and ast.get_docstring(member) is None):
                    found.append(f"{where}:{member.lineno}: {node.name}.{member.name} has no docstring")
    return found


def violations(root: Path = ROOT) -> list[str]:
    """Every undocumented public definition of the plugin API."""
    found = []
    for path in sorted((root / PLUGIN_API).rglob("*.py")):
        found += missing_docstrings(path, root)
    return found


if __name__ == "__main__":
    found = violations()
    print("\n".join(found) or "docstrings: the plugin API is fully documented")
    sys.exit(1 if found else 0)
