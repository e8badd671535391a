"""Which files the checks look at: the non-test Python sources of every distribution."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("core/src", "server/src", "platforms/*/src", "attention_backends/*/src", "quantization/*/src",
                "plugins/*/src", "plugins/examples/*/src")
CORE_SOURCE_ROOT = "core/src"
SKIPPED_PARTS = {"tests", "test", "__pycache__", "build", "dist"}


def is_test_file(path: Path) -> bool:
    """Test modules, conftest files and anything inside a tests/ folder or build output."""
    return (path.name.startswith("test_") or path.name == "conftest.py"
            or any(part in SKIPPED_PARTS or part.endswith(".egg-info") for part in path.parts))


def source_roots(root: Path = ROOT) -> list[Path]:
    """Every existing ``src`` folder matched by ``SOURCE_ROOTS``."""
    found = []
    for pattern in SOURCE_ROOTS:
        found += [p for p in sorted(root.glob(pattern)) if p.is_dir()]
    return found


def source_files(root: Path = ROOT) -> list[tuple[Path, Path]]:
    """(src folder, file) for every non-test ``.py`` file under the source roots."""
    files = []
    for src in source_roots(root):
        files += [(src, path) for path in sorted(src.rglob("*.py")) if not is_test_file(path.relative_to(src))]
    return files


def module_name(src: Path, path: Path) -> str:
    """The dotted import name of ``path`` inside the ``src`` folder."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)
