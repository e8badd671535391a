"""Import rules that keep the design honest, checked on the syntax tree (not by grep).

1. ``tokenmill.plugin_api`` imports nothing from tokenmill outside ``tokenmill.plugin_api``.
2. Core (``core/src/tokenmill``) never imports a device runtime or vendor library
   (``torch.cuda``, ``torch.xpu``, ``torch.mps``, ``torch.backends.{cuda,cudnn,mps}``, pynvml,
   amdsmi, intel_extension_for_pytorch, ...) and never touches such attributes
   (``torch.cuda.synchronize()``, ``torch.version.cuda``, ``tensor.is_cuda``); it asks the Platform.
3. ``tokenmill.scheduler``, ``tokenmill.kv_cache`` and ``tokenmill.request`` import no torch, neither
   directly (anywhere) nor through the tokenmill modules they import at module level
   (imports under ``if TYPE_CHECKING:`` do not count).
4. First-party plugins (server/, platforms/, attention_backends/, quantization/, plugins/) use only
   tokenmill's public names: "public" means every component of the imported module path and every
   imported name does not start with an underscore (``tokenmill.plugin_api`` is the contract;
   ``from tokenmill.engine._step import x`` or ``from tokenmill.engine import _helper`` are not).
5. ``tokenmill.engine_core`` (the engine process) never imports ``tokenmill.frontend`` (the API
   process), not even inside a function: the two meet only in ``tokenmill.wire``.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

from ci.source_tree import CORE_SOURCE_ROOT, ROOT, module_name, source_files

BANNED_MODULES = ("torch.cuda", "torch.xpu", "torch.mps", "torch.backends.mps", "torch.backends.cuda",
                  "torch.backends.cudnn", "torch.version.cuda", "torch.version.hip",
                  "pynvml", "amdsmi", "pyrsmi", "intel_extension_for_pytorch", "oneccl_bindings_for_pytorch",
                  "torch_npu", "habana_frameworks", "cupy", "pycuda", "cuda", "mlx", "tensorrt",
                  "flash_attn", "flashinfer", "xformers")
BANNED_ATTRIBUTES = ("is_cuda",)
TORCH_FREE_PACKAGES = ("tokenmill.scheduler", "tokenmill.kv_cache", "tokenmill.request")


@dataclass(frozen=True)
class Import:
    """One imported module (``from m import n`` yields ``m`` with names and ``m.n`` candidates)."""

    module: str
    names: tuple[str, ...]
    line: int
    module_level: bool  # executed when the module is imported (not in a function or TYPE_CHECKING)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _resolve(module: str | None, level: int, current: str, is_package: bool) -> str:
    if not level:
        return module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


class _Collector(ast.NodeVisitor):
    def __init__(self, current: str, is_package: bool) -> None:
        self.current, self.is_package = current, is_package
        self.imports: list[Import] = []
        self.aliases: dict[str, str] = {}  # local name -> module it names
        self.attributes: list[tuple[str, int]] = []
        self._depth = 0  # inside functions or TYPE_CHECKING blocks

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports.append(Import(alias.name, (), node.lineno, self._depth == 0))
            local = alias.asname or alias.name.split(".")[0]
            self.aliases[local] = alias.name if alias.asname else alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = _resolve(node.module, node.level, self.current, self.is_package)
        names = tuple(alias.name for alias in node.names)
        self.imports.append(Import(module, names, node.lineno, self._depth == 0))
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"

    def _nested(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _nested

    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        if test in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            self._nested(node)
        else:
            self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parts, value = [node.attr], node.value
        while isinstance(value, ast.Attribute):
            parts.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in self.aliases:
            self.attributes.append((".".join([self.aliases[value.id], *reversed(parts)]), node.lineno))
        if node.attr in BANNED_ATTRIBUTES:
            self.attributes.append((f"<expr>.{node.attr}", node.lineno))
        self.generic_visit(node)


@dataclass
class Module:
    """One parsed source module."""

    name: str
    path: Path
    src: Path
    core: bool
    collector: _Collector

    def where(self, line: int, root: Path) -> str:
        return f"{self.path.relative_to(root).as_posix()}:{line}"


def parse_modules(root: Path = ROOT) -> list[Module]:
    """Every source module, parsed."""
    modules = []
    for src, path in source_files(root):
        name = module_name(src, path)
        collector = _Collector(name, path.name == "__init__.py")
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        core = src == root / CORE_SOURCE_ROOT
        modules.append(Module(name, path, src, core, collector))
    return modules


def _imported_names(item: Import) -> list[str]:
    return [item.module] + [f"{item.module}.{n}" for n in item.names if n != "*"]


def check_plugin_api(modules: list[Module], root: Path) -> list[str]:
    """Rule 1."""
    found = []
    for module in modules:
        if not (module.core and _within(module.name, "tokenmill.plugin_api")):
            continue
        for item in module.collector.imports:
            if item.module == "tokenmill":
                outside = [f"tokenmill.{n}" for n in item.names if n != "plugin_api"]
            elif _within(item.module, "tokenmill") and not _within(item.module, "tokenmill.plugin_api"):
                outside = [item.module]
            else:
                outside = []
            found += [f"{module.where(item.line, root)}: tokenmill.plugin_api imports {name}; the plugin contract may "
                      f"import nothing else from tokenmill" for name in outside]
    return found


def check_core_neutrality(modules: list[Module], root: Path) -> list[str]:
    """Rule 2."""
    found = []
    for module in (m for m in modules if m.core):
        for item in module.collector.imports:
            for name in _imported_names(item):
                banned = next((b for b in BANNED_MODULES if _within(name, b)), None)
                if banned:
                    found.append(f"{module.where(item.line, root)}: core imports {name}; ask the Platform instead")
                    break
        longest: dict[tuple[int, str], str] = {}  # one finding per line and banned name (outermost expression)
        for dotted, line in module.collector.attributes:
            last = dotted.rsplit(".", 1)[-1]
            banned = next((b for b in BANNED_MODULES if _within(dotted, b)), last if last in BANNED_ATTRIBUTES else None)
            if banned and len(dotted) > len(longest.get((line, banned), "")):
                longest[(line, banned)] = dotted
        found += [f"{module.where(line, root)}: core uses {dotted}; ask the Platform instead"
                  for (line, _), dotted in sorted(longest.items())]
    return found


def check_torch_free(modules: list[Module], root: Path) -> list[str]:
    """Rule 3."""
    by_name = {m.name: m for m in modules if m.core}
    found = []

    def edges(name: str) -> list[tuple[str, int]]:
        module = by_name[name]
        result = []
        if "." in name:
            result.append((name.rsplit(".", 1)[0], 0))  # importing a module imports its package
        for item in module.collector.imports:
            if item.module_level:
                result += [(n, item.line) for n in _imported_names(item)]
        return result

    def torch_chain(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], {start}
        while stack:
            name, chain = stack.pop()
            for target, _ in edges(name):
                if _within(target, "torch"):
                    return chain + ["torch"]
                if target in by_name and target not in seen:
                    seen.add(target)
                    stack.append((target, chain + [target]))
        return None

    for module in (m for m in modules if m.core and any(_within(m.name, p) for p in TORCH_FREE_PACKAGES)):
        for item in module.collector.imports:
            if any(_within(n, "torch") for n in _imported_names(item)):
                found.append(f"{module.where(item.line, root)}: {module.name} imports torch; the scheduler, "
                             f"KV-cache manager and requests stay pure Python")
        chain = torch_chain(module.name)
        if chain and len(chain) > 2:
            found.append(f"{module.where(1, root)}: {module.name} imports torch indirectly: {' -> '.join(chain)}")
    return found


def check_plugin_imports(modules: list[Module], root: Path) -> list[str]:
    """Rule 4."""
    found = []
    for module in (m for m in modules if not m.core):
        for item in module.collector.imports:
            if not _within(item.module, "tokenmill"):
                continue
            private = [p for p in item.module.split(".") if p.startswith("_")]
            private += [n for n in item.names if n.startswith("_")]
            if private:
                found.append(f"{module.where(item.line, root)}: {module.name} uses tokenmill's private "
                             f"{', '.join(private)} (from {item.module}); plugins may use only public names")
    return found


def check_engine_core_boundary(modules: list[Module], root: Path) -> list[str]:
    """Rule 5."""
    found = []
    for module in (m for m in modules if m.core and _within(m.name, "tokenmill.engine_core")):
        for item in module.collector.imports:
            if any(_within(name, "tokenmill.frontend") for name in _imported_names(item)):
                found.append(f"{module.where(item.line, root)}: {module.name} imports the front end "
                             f"({item.module}); the engine core reaches it only through tokenmill.wire")
    return found


def violations(root: Path = ROOT) -> list[str]:
    """Every import-rule violation in the tree."""
    modules = parse_modules(root)
    return (check_plugin_api(modules, root) + check_core_neutrality(modules, root)
            + check_torch_free(modules, root) + check_plugin_imports(modules, root)
            + check_engine_core_boundary(modules, root))


if __name__ == "__main__":
    found = violations()
    print("\n".join(found) or "import rules: no violations")
    sys.exit(1 if found else 0)
