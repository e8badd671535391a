"""Repository-wide test setup, loaded before any test module.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when its module is first imported —
and in a full run some test module (e.g. core's graph-runner tests) imports the Triton kernels long
before the Triton packages' own conftests load. So interpreter mode is decided here, once: on a
machine without a GPU every Triton kernel runs in the interpreter on CPU tensors.
"""

import os

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
