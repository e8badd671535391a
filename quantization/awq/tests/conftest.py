"""Tiny quantized checkpoints and a tokenmill runner for end-to-end tests against transformers.

TRITON_INTERPRET is set here, before any test imports the Triton kernels, on machines without a
GPU: the test_quant_awq_triton tests then run the kernels in Triton's interpreter on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

HARNESS = Path(__file__).resolve().parents[3] / "core" / "tests" / "paged_attention_harness.py"


class QuantizedCheckpoints:
    """Writes a tiny random Llama with its linear layers quantized, and runs tokenmill on it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write(self, quantize: Callable[[str, torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]],
              quantization_config: dict, **config_overrides):
        """Save a checkpoint whose decoder linears are ``quantize(name, weight) -> (tensors, float
        weights they encode)``; returns (directory, the HF model computing with those float weights)."""
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             initializer_range=0.1, **config_overrides)
        model = LlamaForCausalLM(config).eval()
        state = {}
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                tensors, dequantized = quantize(name, module.weight.data)
                state.update(tensors)
                module.weight.data.copy_(dequantized)
        for name, tensor in model.state_dict().items():
            module = name.rpartition(".")[0]
            if not any(key.startswith(module + ".") for key in state) and name not in state:
                state[name] = tensor.contiguous()
        state.pop("lm_head.weight") if config.tie_word_embeddings else None
        save_file(state, str(self.directory / "model.safetensors"))
        saved = config.to_dict()
        saved["quantization_config"] = quantization_config
        (self.directory / "config.json").write_text(json.dumps(saved))
        return self.directory, model

    @staticmethod
    def tokenmill_logits(directory: Path, quantizer, tokens: list[int], dtype: torch.dtype = torch.float32):
        """Prefill logits of ``tokens`` from tokenmill's model loaded with ``quantizer``."""
        from tokenmill.layers.context import ModelBuildContext
        from tokenmill.loader.model_loader import build_model, load_weights
        from tokenmill.reference.attention import ReferenceAttentionBackend

        config = json.loads((directory / "config.json").read_text())
        build = ModelBuildContext(dtype=dtype, quantizer=quantizer, attention_backend=ReferenceAttentionBackend)
        model = build_model(config, build)
        load_weights(model, str(directory), quantizer)
        harness = _load_harness().PagedHarness(block_size=16, num_blocks=8)
        backend = ReferenceAttentionBackend()
        caches = harness.allocate_caches(backend, model.attention_specs())
        step = harness.step([(0, tokens)])
        with torch.inference_mode():
            hidden = model(step.input_ids, step.positions, harness.context(backend, caches, step))
            return model.compute_logits(hidden), build

    @staticmethod
    def hf_logits(model, tokens: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model(input_ids=torch.tensor([tokens])).logits[0]


def _load_harness():
    spec = importlib.util.spec_from_file_location("paged_attention_harness", HARNESS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def checkpoints(tmp_path) -> QuantizedCheckpoints:
    return QuantizedCheckpoints(tmp_path)
