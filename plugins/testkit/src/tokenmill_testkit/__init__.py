"""Conformance suites for tokenmill plugins: subclass one in a test file and point it at your class.

    from tokenmill_testkit import AttentionBackendConformance

    class TestMyBackend(AttentionBackendConformance):
        backend_cls = MyBackend
        device = "cpu"

The suites compare against core's reference implementations. This package is also a pytest plugin
(loaded for every pytest run), so importing it stays cheap: the suites load on first use.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "PlatformConformance": "tokenmill_testkit.platform_conformance",
    "AttentionBackendConformance": "tokenmill_testkit.attention_conformance",
    "AttentionCase": "tokenmill_testkit.attention_cases",
    "CommunicatorConformance": "tokenmill_testkit.communicator_conformance",
    "BatchMix": "tokenmill_testkit.attention_cases",
    "QuantizerConformance": "tokenmill_testkit.quantizer_conformance",
    "ProcessSnapshot": "tokenmill_testkit.side_effects",
    "ScheduledRequest": "tokenmill_testkit.attention_batch",
    "make_attention_batch": "tokenmill_testkit.attention_batch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tokenmill_testkit' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
