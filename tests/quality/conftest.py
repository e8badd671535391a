"""Fixtures for the quantization quality tests: a tiny random Llama with SmolLM2's tokenizer, a
format-independent dequantization of any checkpoint ``tokenmill quantize`` writes (the oracle
the engine is compared against), and prompt log-probabilities from tokenmill's engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

# smollm2.py (the real model and its fp32 safetensors copy) lives with the integration tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer random Llama (hidden 128, GQA 4/2) saved with SmolLM2's tokenizer."""
    import smollm2
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = smollm2.load_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def dequantized_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a quantized checkpoint with its linear weights decoded to float32 by each
    format's reference arithmetic (``W = f(stored tensors)``), under the float model's names."""
    from safetensors.torch import load_file

    config = json.loads((directory / "config.json").read_text())["quantization_config"]
    stored = load_file(str(directory / "model.safetensors"))
    method = config["quant_method"]
    state, prefixes = {}, {name.rsplit(".", 1)[0] for name in stored if name.endswith((".qweight", "weight_scale",
                                                                                     "weight_scale_inv"))}
    for name, tensor in stored.items():
        if name.rsplit(".", 1)[0] not in prefixes:
            state[name] = tensor.float()
    for prefix in prefixes:
        get = lambda suffix, p=prefix: stored[f"{p}.{suffix}"]  # noqa: E731
        if method == "gptq":
            from tokenmill_quant_gptq.dequantize import dequantize_columns

            layer = SimpleNamespace(qweight=get("qweight"), qzeros=get("qzeros"), scales=get("scales"),
                                    g_idx=get("g_idx"))
            out_features = layer.scales.shape[1]
            weight = dequantize_columns(layer, config["bits"], 1, 0, out_features, torch.float32).T
        elif method == "awq":
            from tokenmill_quant_awq.torch_kernel import dequantize_columns

            layer = SimpleNamespace(qweight=get("qweight"), qzeros=get("qzeros"), scales=get("scales"),
                                    awq_group_size=config["group_size"])
            weight = dequantize_columns(layer, 0, layer.scales.shape[1], torch.float32).T
        elif method == "fp8" and "weight_block_size" in config:
            rows, columns = config["weight_block_size"]
            codes = get("weight").float()
            scales = get("weight_scale_inv").repeat_interleave(rows, 0).repeat_interleave(columns, 1)
            weight = codes * scales[: codes.shape[0], : codes.shape[1]]
        else:  # fp8 per channel, int8
            weight = get("weight").float() * get("weight_scale")
        state[f"{prefix}.weight"] = weight.contiguous()
    return state


def hf_prompt_logprobs(directory: Path, state: dict[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """log p(token i | tokens < i) for i >= 1 from transformers' Llama with ``state`` loaded."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(directory)
    config.quantization_config = None
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    with torch.inference_mode():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]


def tokenmill_prompt_logprobs(directory: Path, windows: list[list[int]]) -> list[torch.Tensor]:
    """The same log-probabilities from tokenmill's engine (``prompt_logprobs``), one tensor per window."""
    from tokenmill import LLM, SamplingParams

    llm = LLM(str(directory), dtype="float32", kv_cache_memory="256MiB")
    outputs = llm.generate([{"prompt_token_ids": w} for w in windows], SamplingParams(max_tokens=1, prompt_logprobs=0),
                           use_tqdm=False)
    return [torch.tensor([entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], window[1:],
                                                                        strict=True)])
            for out, window in zip(outputs, windows, strict=True)]


@pytest.fixture
def dequantize():
    """``dequantized_state_dict``."""
    return dequantized_state_dict


@pytest.fixture
def reference_logprobs():
    """``hf_prompt_logprobs``."""
    return hf_prompt_logprobs


@pytest.fixture
def engine_logprobs():
    """``tokenmill_prompt_logprobs``."""
    return tokenmill_prompt_logprobs


def quantized_smollm2(format_name: str, options: list[str]) -> Path:
    """SmolLM2-135M written by ``tokenmill quantize --format format_name *options``, cached under
    .cache/test-fixtures by content: the float model's fingerprint, the options, torch's version and
    the source of tokenmill.plugin_api.quantize_tools and of the format's distribution (a code change
    re-quantizes)."""
    import hashlib
    import importlib.util
    import shutil

    import smollm2

    from tokenmill.cli.main import main

    source = smollm2.safetensors_dir()
    packages = [importlib.util.find_spec(name).submodule_search_locations[0]
                for name in ("tokenmill.plugin_api.quantize_tools", f"tokenmill_quant_{format_name}")]
    digest = hashlib.sha256(json.dumps([source.name, format_name, options, torch.__version__]).encode())
    for file in sorted(p for package in packages for p in Path(package).glob("*.py")):
        digest.update(file.read_bytes())
    target = smollm2.CACHE / f"smollm2-{format_name}-{digest.hexdigest()[:12]}"
    if (target / "config.json").is_file():
        return target
    partial = target.with_name(target.name + ".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    assert main(["quantize", str(source), str(partial), "--format", format_name, *options]) == 0
    partial.rename(target)
    return target


@pytest.fixture(scope="session")
def quantized_model():
    """``quantized_smollm2``."""
    return quantized_smollm2
