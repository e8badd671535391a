"""Repository-wide test setup, loaded before any test module: interpreter mode for Triton, and the
fixtures the plugins' tests share: ``model_harness`` (tokenmill's model for a checkpoint, built and
stepped as the engine does) and ``checkpoints`` (tiny quantized checkpoints beside transformers).
A plugin's tests import nothing of core but ``tokenmill.plugin_api`` and the public top-level names
(``ci/check_plugin_contract.py``): where they run a whole model through core, they ask these fixtures.

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
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


class ModelHarness:
    """Tokenmill's model for a checkpoint, built and run the way the engine does (core's model
    building, paged attention steps and model runner stay here, behind what a plugin test asks)."""

    # core's PyTorch layers by LayerKernels operation: what a platform's layer kernels must match
    TORCH_LAYERS = {"rms_norm": "tokenmill.layers.norm:RMSNorm", "silu_and_mul": "tokenmill.layers.activation:SiluAndMul",
                    "rotary_angles": "tokenmill.layers.rotary:RotaryAngles", "rotary": "tokenmill.layers.rotary:build_rotary",
                    "embedding": "tokenmill.layers.embedding:VocabEmbedding"}

    @classmethod
    def torch_layer(cls, operation: str, *args, **kwargs):
        """Core's PyTorch layer for a LayerKernels ``operation`` (see ``TORCH_LAYERS``), made with ``args``."""
        import importlib

        module, _, name = cls.TORCH_LAYERS[operation].partition(":")
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    @staticmethod
    def build(hf_config, *, quantizer=None, dtype: torch.dtype = torch.float32, attention_backend=None, platform=None,
              block_size: int = 16):
        """(model, build context) for ``hf_config`` with ``quantizer``, its weights not loaded; on
        ``platform`` (its device, kernel preference and layer kernels) when given."""
        from tokenmill.layers.context import ModelBuildContext
        from tokenmill.loader.model_loader import build_model
        from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend

        backend = attention_backend or ReferenceAttentionBackend
        if platform is not None:
            build = ModelBuildContext.for_platform(platform, dtype=dtype, quantizer=quantizer, block_size=block_size,
                                                   attention_backend=backend)
        else:
            build = ModelBuildContext(dtype=dtype, quantizer=quantizer, attention_backend=backend,
                                      block_size=block_size)
        return build_model(hf_config, build), build

    @classmethod
    def load(cls, path: str | Path, hf_config=None, *, quantizer=None, **build_options):
        """``build`` for the checkpoint at ``path`` (its config.json unless ``hf_config`` is given),
        then its weights loaded (through ``quantizer`` when it supplies them)."""
        from tokenmill.loader.model_loader import load_weights

        if hf_config is None:
            hf_config = json.loads((Path(path) / "config.json").read_text())
        model, build = cls.build(hf_config, quantizer=quantizer, **build_options)
        load_weights(model, str(path), quantizer)
        return model, build

    @staticmethod
    def step_logits(model, steps, backend=None, block_size: int = 16, num_blocks: int = 32) -> list[torch.Tensor]:
        """Run ``steps`` (each a list of (request, new tokens) chunks, requests growing across steps)
        through paged attention; per step, float32 logits at the last token of every chunk."""
        from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
        from tokenmill.reference.paged_harness import PagedHarness

        backend = backend or ReferenceAttentionBackend()
        harness = PagedHarness(block_size=block_size, num_blocks=num_blocks)
        caches = harness.allocate_caches(backend, model.attention_specs())
        logits = []
        with torch.inference_mode():
            for chunks in steps:
                step = harness.step(chunks)
                hidden = model(step.input_ids, step.positions, harness.context(backend, caches, step))
                last = torch.tensor([len(tokens) for _, tokens in chunks]).cumsum(0) - 1
                logits.append(model.compute_logits(hidden[last]).float())
        return logits

    @staticmethod
    def prefill_logits(model, tokens: list[int], backend=None) -> torch.Tensor:
        """Logits at every position of one request's prefill of ``tokens``."""
        from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
        from tokenmill.reference.paged_harness import PagedHarness

        backend = backend or ReferenceAttentionBackend()
        harness = PagedHarness(block_size=16, num_blocks=8)
        caches = harness.allocate_caches(backend, model.attention_specs())
        step = harness.step([(0, tokens)])
        with torch.inference_mode():
            return model.compute_logits(model(step.input_ids, step.positions, harness.context(backend, caches, step)))

    @staticmethod
    def decode_graphs_beside_eager(model, backend, new_graph, requests, *, max_num_seqs: int, block_size: int,
                                   num_blocks: int, max_model_len: int, vocab_size: int) -> SimpleNamespace:
        """Capture decode graphs made by ``new_graph`` for up to ``max_num_seqs`` requests, then serve
        ``requests`` ((prompt, max_tokens) pairs, greedy with 3 logprobs) twice through core's scheduler
        and model runner, eagerly and through the graphs: every step's tokens, logprobs and KV cache
        must match. Returns ``buckets`` (the captured batch sizes), ``num_calls`` (each graph's
        recorded native calls) and ``replayed`` (the batch size of every step the graphs took)."""
        from tokenmill import SamplingParams
        from tokenmill.request import Request
        from tokenmill.runner.graph_runner import DecodeGraphRunner
        from tokenmill.runner.model_runner import ModelRunner
        from tokenmill.scheduler import Scheduler, SchedulerConfig

        def runner() -> ModelRunner:
            return ModelRunner(model, backend, num_blocks=num_blocks, block_size=block_size, max_num_batched_tokens=64,
                               max_num_seqs=8, max_model_len=max_model_len, vocab_size=vocab_size,
                               device=torch.device("cpu"))

        plain, graphed = runner(), runner()
        graphs = graphed.decode_graphs = DecodeGraphRunner(
            model, backend, graphed.kv_caches, max_num_seqs=max_num_seqs,
            max_blocks_per_seq=graphed.inputs.max_blocks_per_seq, block_size=block_size, device=graphed.device,
            new_graph=new_graph)
        assert graphs.capture(), "no decode graph was captured"
        scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=max_model_len,
                                              block_size=block_size, num_blocks=num_blocks))
        for i, (prompt, max_tokens) in enumerate(requests):
            scheduler.add_request(Request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                          ignore_eos=True, logprobs=3)))
        outputs: dict[str, list[int]] = {}
        replayed = []
        while scheduler.has_unfinished_requests():
            step = scheduler.schedule()
            if graphs.accepts(graphed.inputs.build(step.scheduled)):
                replayed.append(len(step.scheduled))
            want, got = plain.execute(step), graphed.execute(step)
            assert got.sampled_token_ids == want.sampled_token_ids
            for request_id, (entry,) in want.logprobs.items():
                (graphed_entry,) = got.logprobs[request_id]
                assert graphed_entry.token_ids == entry.token_ids
                torch.testing.assert_close(graphed_entry.logprobs, entry.logprobs, atol=1e-5, rtol=0)
            for cache_plain, cache_graphed in zip(plain.kv_caches, graphed.kv_caches, strict=True):
                torch.testing.assert_close(cache_graphed[:, 1:], cache_plain[:, 1:], atol=1e-5, rtol=0)  # 0: padding
            for update in scheduler.update(step, want.sampled_token_ids):
                outputs.setdefault(update.request.request_id, []).extend(update.new_token_ids)
        assert sorted(len(tokens) for tokens in outputs.values()) == sorted(n for _, n in requests)
        return SimpleNamespace(buckets=graphs.buckets, replayed=replayed,
                               num_calls=[graph.num_calls for graph in graphs.graphs.values()])


@pytest.fixture(scope="session")
def model_harness() -> ModelHarness:
    return ModelHarness()


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
        model, build = ModelHarness.load(directory, quantizer=quantizer, dtype=dtype)
        return ModelHarness.prefill_logits(model, tokens), build

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
