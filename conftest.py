"""Repository-wide test setup, loaded before any test module: interpreter mode for Triton, and the
``checkpoints`` fixture the quantization plugins' tests share.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when its module is first imported —
and in a full run some test module (e.g. core's graph-runner tests) imports the Triton kernels long
before the Triton packages' own conftests load. So interpreter mode is decided here, once: on a
machine without a GPU every Triton kernel runs in the interpreter on CPU tensors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


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
        from tokenmill.reference.paged_harness import PagedHarness

        config = json.loads((directory / "config.json").read_text())
        build = ModelBuildContext(dtype=dtype, quantizer=quantizer, attention_backend=ReferenceAttentionBackend)
        model = build_model(config, build)
        load_weights(model, str(directory), quantizer)
        harness = PagedHarness(block_size=16, num_blocks=8)
        backend = ReferenceAttentionBackend()
        caches = harness.allocate_caches(backend, model.attention_specs())
        step = harness.step([(0, tokens)])
        with torch.inference_mode():
            hidden = model(step.input_ids, step.positions, harness.context(backend, caches, step))
            return model.compute_logits(hidden), build

    def kernels_matching_transformers(self, quantize: Callable, quantization_config: dict, quantizer_cls,
                                      tokens: list[int], prepare_reference: Callable | None = None) -> dict[str, int]:
        """Write a checkpoint (see ``write``), load it with ``quantizer_cls.from_config`` and check that
        tokenmill's prefill logits of ``tokens`` equal transformers' on the float weights it encodes
        (after ``prepare_reference(model)``, e.g. to round activations as the kernels do); returns the
        build's kernel summary."""
        directory, reference = self.write(quantize, quantization_config)
        quantizer = quantizer_cls.from_config(json.loads((directory / "config.json").read_text()), str(directory))
        got, build = self.tokenmill_logits(directory, quantizer, tokens)
        if prepare_reference is not None:
            prepare_reference(reference)
        torch.testing.assert_close(got, self.hf_logits(reference, tokens), atol=1e-4, rtol=1e-4)
        return build.kernel_summary()

    @staticmethod
    def hf_logits(model, tokens: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model(input_ids=torch.tensor([tokens])).logits[0]


@pytest.fixture
def checkpoints(tmp_path) -> QuantizedCheckpoints:
    return QuantizedCheckpoints(tmp_path)
