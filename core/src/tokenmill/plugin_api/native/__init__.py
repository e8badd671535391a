"""C kernels for plugins: built once per machine, and called so that a CPU decode graph can record them.

* ``build_native_library(source, what)`` compiles a plugin's C source with the host compiler into a
  per-machine cache and loads it with ctypes; ``NativeBuildError`` says why it could not, and
  ``build_failure(load)`` turns a loader into that reason (or None) for ``availability()``.
* ``native_call(function, *args)`` calls a ctypes function; inside a ``NativeRecording`` the call is
  also recorded, so a platform's decode graph can replay the forward's kernels without Python.
"""

from tokenmill.plugin_api.native.library import (
    FLAGS,
    NativeBuildError,
    build_failure,
    build_native_library,
    cache_dir,
    compiler,
    source_text,
)
from tokenmill.plugin_api.native.recording import NativeRecording, native_call

__all__ = [
    "FLAGS",
    "NativeBuildError",
    "NativeRecording",
    "build_failure",
    "build_native_library",
    "cache_dir",
    "compiler",
    "native_call",
    "source_text",
]
