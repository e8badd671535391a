"""NativeKernels: compile ``paged_decode.c`` once per machine and call it through ctypes.

The library is built with ``cc -O3 -march=native -fopenmp`` (reassociation allowed, never -ffast-math) into a cache folder keyed by the source
hash and the compiler, so later processes load it in milliseconds; without a C compiler the kernels
are unavailable and the CPU platform falls back to the plain-PyTorch attention (with that reason).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

SOURCE = Path(__file__).with_name("paged_decode.c")
MAX_HEAD_SIZE = 256
MAX_GROUP = 64


class KernelBuildError(RuntimeError):
    """The C kernels could not be compiled or loaded here."""


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _cpu_signature() -> bytes:
    """The CPU's model and flags: a library built with -march=native must not move to another CPU."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            return b"".join(line for line in f if line.startswith((b"model name", b"flags")))
    except OSError:
        import platform

        return platform.processor().encode()


def cache_dir() -> Path:
    base = os.environ.get("TOKENMILL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tokenmill")
    return Path(base) / "cpu_kernels"


@lru_cache(maxsize=1)
def load_library() -> ctypes.CDLL:
    """The compiled library (built on first use); KernelBuildError with the compiler's message otherwise."""
    compiler = _compiler()
    if compiler is None:
        raise KernelBuildError("no C compiler (cc/gcc) found to build the CPU attention kernel")
    digest = hashlib.sha256(SOURCE.read_bytes() + compiler.encode() + _cpu_signature()).hexdigest()[:16]
    target = cache_dir() / f"paged_decode-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            # no -ffast-math: it links crtfastmath, whose constructor flushes subnormals to zero for the
            # whole process (torch included); the flags below only let the compiler vectorise reductions
            command = [compiler, "-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
                       "-fassociative-math", "-fopenmp", "-shared", "-fPIC", str(SOURCE), "-o", str(built), "-lm"]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise KernelBuildError(f"compiling the CPU attention kernel failed: {result.stderr.strip()[-500:]}")
            os.replace(built, target)
    try:
        library = ctypes.CDLL(str(target))
    except OSError as error:
        raise KernelBuildError(f"loading the CPU attention kernel failed: {error}") from error
    function = library.paged_decode_f32
    pointer, i64 = ctypes.c_void_p, ctypes.c_int64
    function.argtypes = [pointer] * 5 + [i64] * 7 + [ctypes.c_float, i64, ctypes.c_float]
    function.restype = None
    return library


def unavailable_reason() -> str | None:
    """Why the native kernels cannot be used here, or None."""
    try:
        load_library()
    except KernelBuildError as error:
        return str(error)
    return None
