"""ProcessSnapshot: the process state a platform probe must leave alone.

Compared before and after a probe: ``os.environ``, ``sys.modules`` (modules removed, device
runtimes or other compiled extensions newly imported), the initialisation state of torch's device
runtimes, and the attributes of already-loaded tokenmill and torch modules (monkey-patching).
Importing pure-Python modules (the plugin's own, the standard library's) is fine.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

# Top-level modules of device runtimes and vendor kernel libraries: a probe must not import them.
DEVICE_RUNTIME_MODULES = frozenset({
    "amdsmi", "cuda", "cupy", "deep_gemm", "dpctl", "flash_attn", "flashinfer", "habana_frameworks",
    "hip", "intel_extension_for_pytorch", "jax", "mlx", "nvidia_smi", "openvino", "pycuda", "pynvml",
    "pyopencl", "pyrsmi", "tensorflow", "tensorrt", "torch_mlu", "torch_musa", "torch_npu", "torch_xla",
    "triton", "vllm", "xformers",
})
# Compiled extensions that may appear as a side effect of using torch at all.
ALLOWED_EXTENSION_ROOTS = frozenset({"torch", "numpy"})
WATCHED_TORCH_MODULES = frozenset({"torch", "torch.nn.functional", "torch.cuda", "torch.backends", "torch.library"})


def _runtime_state() -> dict[str, bool]:
    import torch

    state = {}
    for name in ("cuda", "xpu"):
        module = getattr(torch, name, None)
        if module is not None and hasattr(module, "is_initialized"):
            state[f"torch.{name}"] = bool(module.is_initialized())
    return state


def _watched_attributes() -> dict[str, dict[str, int]]:
    watched = {}
    for name, module in list(sys.modules.items()):
        ours = name == "tokenmill" or name.startswith("tokenmill.")
        if module is None or not (ours or name in WATCHED_TORCH_MODULES):
            continue
        watched[name] = {attr: id(value) for attr, value in list(vars(module).items())}
    return watched


def _is_extension(module_name: str) -> bool:
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None) or ""
    return path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


@dataclass(frozen=True)
class ProcessSnapshot:
    environ: dict[str, str]
    modules: frozenset[str]
    runtimes: dict[str, bool]
    attributes: dict[str, dict[str, int]]

    @classmethod
    def take(cls) -> ProcessSnapshot:
        """Record the current process state (imports torch first, so torch itself never counts)."""
        runtimes = _runtime_state()
        return cls(dict(os.environ), frozenset(sys.modules), runtimes, _watched_attributes())

    def violations(self, after: ProcessSnapshot, allowed_roots: Iterable[str] = ()) -> list[str]:
        """What changed between this snapshot and ``after`` that a probe must not change.
        ``allowed_roots`` are top-level packages whose compiled extensions may be imported."""
        found = []
        keys = self.environ.keys() | after.environ.keys()
        changed = sorted(k for k in keys if self.environ.get(k) != after.environ.get(k))
        if changed:
            found.append(f"os.environ changed: {', '.join(changed)}")
        removed = sorted(self.modules - after.modules)
        if removed:
            found.append(f"modules removed from sys.modules: {', '.join(removed[:10])}")
        allowed = ALLOWED_EXTENSION_ROOTS | set(allowed_roots) | set(sys.stdlib_module_names)
        for name in sorted(after.modules - self.modules):
            root = name.split(".", 1)[0]
            if root in DEVICE_RUNTIME_MODULES:
                found.append(f"imported the device runtime or kernel library '{name}'")
            elif root not in allowed and _is_extension(name):
                found.append(f"imported the compiled extension '{name}' (allow it with allowed_probe_imports "
                             f"if it is not a device runtime)")
        for runtime, initialised in after.runtimes.items():
            if initialised and not self.runtimes.get(runtime, False):
                found.append(f"initialised the {runtime} runtime")
        for module, attrs in self.attributes.items():
            now = after.attributes.get(module, {})
            patched = sorted(a for a, ident in attrs.items() if a in now and now[a] != ident)
            if patched:
                found.append(f"replaced attributes of {module}: {', '.join(patched[:10])}")
        return found
