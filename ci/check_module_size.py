"""Module size budget: every non-test source module stays within 400 lines, except those in the
allowlist file (each entry with a justification)."""

from __future__ import annotations

import sys
from pathlib import Path

from ci.source_tree import ROOT, source_files

LIMIT = 400
ALLOWLIST = Path(__file__).with_name("module_size_allowlist.txt")


def read_allowlist(path: Path) -> tuple[dict[str, str], list[str]]:
    """({relative path: justification}, problems with the file itself)."""
    entries, problems = {}, []
    for number, raw in enumerate(path.read_text().splitlines(), start=1) if path.exists() else ():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        file, _, why = line.partition("#")
        if not why.strip():
            problems.append(f"{path.name}:{number}: '{file.strip()}' has no '# justification'")
        entries[file.strip()] = why.strip()
    return entries, problems


def violations(root: Path = ROOT, limit: int = LIMIT, allowlist: Path = ALLOWLIST) -> list[str]:
    """Modules over ``limit`` lines that are not allowlisted, and stale allowlist entries."""
    allowed, problems = read_allowlist(allowlist)
    sizes = {}
    for _, path in source_files(root):
        with open(path, encoding="utf-8") as f:
            sizes[path.relative_to(root).as_posix()] = sum(1 for _ in f)
    for file, lines in sorted(sizes.items()):
        if lines > limit and file not in allowed:
            problems.append(f"{file}: {lines} lines (budget {limit}); split it, or allowlist it in "
                            f"ci/{allowlist.name} with a justification")
    for file in sorted(allowed):
        if sizes.get(file, 0) <= limit:
            state = "does not exist" if file not in sizes else f"has {sizes[file]} lines"
            problems.append(f"ci/{allowlist.name}: stale entry '{file}' ({state}); remove it")
    return problems


if __name__ == "__main__":
    found = violations()
    print("\n".join(found) or f"module size: every module is within {LIMIT} lines")
    sys.exit(1 if found else 0)
