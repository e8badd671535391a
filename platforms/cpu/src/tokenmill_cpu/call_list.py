"""CallList: a CPU graph's recorded native calls replayed by a single C call (``kernels/call_list.c``).

A graph replayed from Python still enters every kernel through ctypes, and after a matrix product
has streamed its weights through the caches that Python runs cold: a bare RMSNorm call cost 20 us
warm and 150 us after a 256 MB read. ``run_call_list`` walks the recorded (function address,
arguments) table in C instead. It is offered on Linux x86-64 and AArch64, whose calling conventions
let one prototype of 20 integer-class and 8 float arguments carry any call that fits (see the C
file), and only for lists of ctypes functions whose declared argument types are integers, pointers
and single-precision floats within those counts; ``CallList.build`` says why otherwise, and the
graph replays from Python. ``TOKENMILL_CPU_CALL_LIST=0`` keeps the Python replay.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenmill.plugin_api.native import NativeBuildError, build_native_library

SOURCE = Path(__file__).parent / "kernels" / "call_list.c"
MAX_INTS = 20
MAX_FLOATS = 8
ENV = "TOKENMILL_CPU_CALL_LIST"
_TARGETS = frozenset({("linux", "x86_64"), ("linux", "aarch64")})
_INTEGERS = frozenset({ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint8, ctypes.c_uint16,
                       ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint, ctypes.c_long, ctypes.c_ulong,
                       ctypes.c_longlong, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_ssize_t, ctypes.c_bool,
                       ctypes.c_void_p, ctypes.c_char_p})


@lru_cache(maxsize=1)
def load_call_list() -> Any:
    """``run_call_list`` from its compiled library (built on first use); NativeBuildError otherwise."""
    function = build_native_library(SOURCE, "CPU call list").run_call_list
    function.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    function.restype = None
    return function


def unavailable_reason() -> str | None:
    """Why call lists are not used in this process, or None."""
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    target = (sys.platform, platform.machine().lower())
    if target not in _TARGETS:
        return f"no call-list prototype for {target[0]} on {target[1]}"
    try:
        load_call_list()
    except NativeBuildError as error:
        return str(error)
    return None


def _is_integer(argtype: Any) -> bool:
    return argtype in _INTEGERS or (isinstance(argtype, type) and issubclass(argtype, ctypes._Pointer))


class CallList:
    """The calls as a table: function addresses, and per call its integer-class and float arguments."""

    def __init__(self, functions: Sequence[int], ints: Sequence[Sequence[int]], floats: Sequence[Sequence[float]]):
        count = len(functions)
        self.count = count
        self._functions = (ctypes.c_void_p * count)(*functions)
        self._ints = (ctypes.c_int64 * (count * MAX_INTS))()
        self._floats = (ctypes.c_float * (count * MAX_FLOATS))()
        for call, (call_ints, call_floats) in enumerate(zip(ints, floats, strict=True)):
            for slot, value in enumerate(call_ints):
                self._ints[call * MAX_INTS + slot] = ctypes.c_int64(value).value
            for slot, value in enumerate(call_floats):
                self._floats[call * MAX_FLOATS + slot] = value
        self._run = load_call_list()

    @classmethod
    def build(cls, calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> CallList | str:
        """The table for ``calls`` (a ``NativeRecording``'s), or why it cannot carry them."""
        reason = unavailable_reason()
        if reason is not None:
            return reason
        functions, ints, floats = [], [], []
        for function, args in calls:
            name = getattr(function, "__name__", repr(function))
            argtypes = getattr(function, "argtypes", None)
            if not isinstance(function, ctypes._CFuncPtr) or argtypes is None or len(argtypes) != len(args):
                return f"{name} is not a ctypes function with declared argument types"
            call_ints, call_floats = [], []
            for argtype, value in zip(argtypes, args, strict=True):
                if argtype is ctypes.c_float and isinstance(value, (int, float)):
                    call_floats.append(float(value))
                elif _is_integer(argtype) and (value is None or isinstance(value, int)):
                    call_ints.append(0 if value is None else value)
                else:
                    return f"{name} takes a {getattr(argtype, '__name__', argtype)} argument {value!r}"
            if len(call_ints) > MAX_INTS or len(call_floats) > MAX_FLOATS:
                return f"{name} takes more than {MAX_INTS} integer or {MAX_FLOATS} float arguments"
            functions.append(ctypes.cast(function, ctypes.c_void_p).value)
            ints.append(call_ints)
            floats.append(call_floats)
        return cls(functions, ints, floats)

    def run(self) -> None:
        """Make every call, in order, from C."""
        self._run(self.count, self._functions, self._ints, self._floats)
