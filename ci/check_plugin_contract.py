"""The plugin contract's allowlist, checked on the syntax tree: every distribution outside core/ and
server/ (platforms, attention backends, quantizers, the testkit, the examples) needs nothing from
tokenmill but ``tokenmill.plugin_api`` and its submodules.

* A distribution's sources (under its ``src/``) import from tokenmill only ``tokenmill.plugin_api``
  and its submodules (``from tokenmill import plugin_api`` included).
* Its tests (every other ``.py`` file of the distribution: tests, conftest files) may also import
  tokenmill's public top-level names (``from tokenmill import LLM, SamplingParams``, the names in
  ``tokenmill.__all__``) and ``import tokenmill`` itself.

Imports at any depth count (in functions, under ``TYPE_CHECKING``), and so do modules named by a
string to ``importlib.import_module``, ``pytest.importorskip`` or ``__import__``.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

from ci.source_tree import CORE_SOURCE_ROOT, ROOT, SKIPPED_PARTS, source_roots

CONTRACT = "tokenmill.plugin_api"
CORE_PACKAGE_INIT = Path(CORE_SOURCE_ROOT) / "tokenmill" / "__init__.py"
DYNAMIC_IMPORTERS = ("import_module", "importorskip", "__import__")


@dataclass(frozen=True)
class TokenmillImport:
    """One import of a tokenmill module: ``module`` with the ``names`` taken from it (``from m import n``)."""

    module: str
    names: tuple[str, ...]
    line: int


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def public_top_level_names(root: Path = ROOT) -> frozenset[str]:
    """The names ``tokenmill/__init__.py`` exports: its ``_LAZY`` keys and the literal entries of ``__all__``."""
    path = root / CORE_PACKAGE_INIT
    if not path.is_file():
        return frozenset()
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            continue
        if node.targets[0].id == "_LAZY" and isinstance(node.value, ast.Dict):
            names |= {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
        elif node.targets[0].id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
            names |= {item.value for item in node.value.elts if isinstance(item, ast.Constant)}
    return frozenset(names)


def tokenmill_imports(tree: ast.AST) -> list[TokenmillImport]:
    """Every import of ``tokenmill`` or one of its modules in ``tree`` (absolute imports only: a
    relative import names the plugin's own package)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [TokenmillImport(alias.name, (), node.lineno) for alias in node.names
                      if _within(alias.name, "tokenmill")]
        elif isinstance(node, ast.ImportFrom) and not node.level and _within(node.module or "", "tokenmill"):
            found.append(TokenmillImport(node.module, tuple(alias.name for alias in node.names), node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            target = node.args[0].value
            if called in DYNAMIC_IMPORTERS and isinstance(target, str) and _within(target, "tokenmill"):
                found.append(TokenmillImport(target, (), node.lineno))
    return found


def disallowed(item: TokenmillImport, in_sources: bool, public: frozenset[str]) -> list[str]:
    """The tokenmill modules or names of ``item`` outside the allowlist."""
    if _within(item.module, CONTRACT):
        return []
    if item.module != "tokenmill":
        return [item.module]
    if not item.names:
        return ["tokenmill"] if in_sources else []
    allowed = {"plugin_api"} if in_sources else {"plugin_api", *public}
    return [f"tokenmill.{name}" for name in item.names if name not in allowed]


def distributions(root: Path = ROOT) -> list[Path]:
    """The folder of every distribution outside core/ and server/ (the parent of its ``src``)."""
    return [src.parent for src in source_roots(root) if src.parent not in (root / "core", root / "server")]


def _python_files(folder: Path) -> list[Path]:
    return [path for path in sorted(folder.rglob("*.py"))
            if not any(part in SKIPPED_PARTS - {"tests", "test"} or part.endswith(".egg-info")
                       for part in path.relative_to(folder).parts)]


def violations(root: Path = ROOT) -> list[str]:
    """Every import outside the allowlist in the plugin distributions, sources and tests."""
    public = public_top_level_names(root)
    found = []
    for folder in distributions(root):
        for path in _python_files(folder):
            in_sources = path.relative_to(folder).parts[0] == "src"
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for item in tokenmill_imports(tree):
                for name in disallowed(item, in_sources, public):
                    where = f"{path.relative_to(root).as_posix()}:{item.line}"
                    allowed = ("tokenmill.plugin_api and its submodules" if in_sources else
                               "tokenmill.plugin_api, its submodules and tokenmill's public top-level names")
                    found.append(f"{where}: imports {name}; a plugin {'source' if in_sources else 'test'} may "
                                 f"import only {allowed}")
    return found


if __name__ == "__main__":
    found = violations()
    print("\n".join(found) or "plugin contract: no violations")
    sys.exit(1 if found else 0)
