"""build_native_library: compile a plugin's C kernels once per machine and load them with ctypes.

Built with ``cc -O3 -march=native -fopenmp`` (reassociation allowed so reductions vectorise, never
-ffast-math) into a cache folder keyed by the source (with the local headers it includes), the
compiler and the CPU, so later processes load it in milliseconds. Plugins declare the C signatures; without a C compiler the build raises
NativeBuildError with the reason, and the plugin offers its plain-PyTorch path instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

# no -ffast-math: it links crtfastmath, whose constructor flushes subnormals to zero for the whole
# process (torch included); these only let the compiler reassociate sums so that they vectorise
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math",
         "-fopenmp", "-shared", "-fPIC")


class NativeBuildError(RuntimeError):
    """The C source could not be compiled or loaded here."""


def compiler() -> str | None:
    """``$CC``, else ``cc`` or ``gcc`` on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cache_dir() -> Path:
    """``$TOKENMILL_CACHE/cpu_kernels`` (default ``~/.cache/tokenmill/cpu_kernels``)."""
    base = os.environ.get("TOKENMILL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tokenmill")
    return Path(base) / "cpu_kernels"


def _cpu_signature() -> bytes:
    """The CPU's model and flags: a library built with -march=native must not move to another CPU."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            return b"".join(line for line in f if line.startswith((b"model name", b"flags")))
    except OSError:
        import platform

        return platform.processor().encode()


LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def source_text(source: Path, seen: set[Path] | None = None) -> bytes:
    """``source`` followed by every local header it includes (``#include "name.h"``, found beside the
    file that includes it, recursively, each once): what a built library depends on besides the
    system headers, so a changed header means a new build."""
    seen = {source.resolve()} if seen is None else seen
    text = source.read_bytes()
    for name in LOCAL_INCLUDE.findall(text):
        header = (source.parent / name.decode()).resolve()
        if header not in seen and header.exists():
            seen.add(header)
            text += source_text(header, seen)
    return text


def build_native_library(source: Path, what: str) -> ctypes.CDLL:
    """The compiled ``source`` (built on first use); ``what`` names it in error messages."""
    cc = compiler()
    if cc is None:
        raise NativeBuildError(f"no C compiler (cc/gcc) found to build the {what}")
    digest = hashlib.sha256(source_text(source) + cc.encode() + _cpu_signature()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            result = subprocess.run([cc, *FLAGS, str(source), "-o", str(built), "-lm"], capture_output=True, text=True)
            if result.returncode != 0:
                raise NativeBuildError(f"compiling the {what} failed: {result.stderr.strip()[-500:]}")
            os.replace(built, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as error:
        raise NativeBuildError(f"loading the {what} failed: {error}") from error


def build_failure(load: Callable[[], object]) -> str | None:
    """Why ``load`` (a plugin's cached library loader) cannot build or load its kernels here, or None."""
    try:
        load()
    except NativeBuildError as error:
        return str(error)
    return None
