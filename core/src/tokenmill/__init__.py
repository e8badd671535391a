"""tokenmill: a hardware-neutral LLM inference engine with a plugin-based hardware abstraction layer.

Public names are imported lazily so that ``import tokenmill`` (e.g. by a plugin probe) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "LLM": "tokenmill.llm",
    "EngineArgs": "tokenmill.config",
    "SamplingParams": "tokenmill.sampling_params",
    "RequestOutputKind": "tokenmill.sampling_params",
    "RequestOutput": "tokenmill.outputs",
    "CompletionOutput": "tokenmill.outputs",
    "LLMEngine": "tokenmill.frontend.llm_engine",
}

__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:
    from tokenmill.config import EngineArgs
    from tokenmill.frontend.llm_engine import LLMEngine
    from tokenmill.llm import LLM
    from tokenmill.outputs import CompletionOutput, RequestOutput
    from tokenmill.sampling_params import RequestOutputKind, SamplingParams


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tokenmill' has no attribute {name!r}")
