"""TritonAttentionBackend as a plugin: discovery, declared capabilities, rejections with reasons."""

import importlib.metadata
import importlib.util
import os

import pytest
import torch

from tokenmill.plugin_api import PLUGIN_API_VERSION, AttentionSpec, is_compatible
from tokenmill_attn_triton import TritonAttentionBackend


def _spec(**overrides) -> AttentionSpec:
    fields = dict(num_heads=8, num_kv_heads=2, head_size=64, scale=0.125, dtype="bfloat16", block_size=16)
    return AttentionSpec(**{**fields, **overrides})


def test_entry_point_names_the_backend():
    (entry,) = [e for e in importlib.metadata.entry_points(group="tokenmill.attention_backends") if e.name == "triton"]
    backend = entry.load()
    assert backend is TritonAttentionBackend
    assert backend.name == "triton"
    assert is_compatible(backend.api_version, PLUGIN_API_VERSION)


def test_kernels_run_in_the_interpreter_when_there_is_no_gpu(interpreted):
    from tokenmill_attn_triton import kv_cache_write, unified_attention

    if torch.cuda.is_available() and not interpreted:
        pytest.skip("a GPU is present: kernels are compiled")
    assert interpreted, "conftest must set TRITON_INTERPRET=1 before the kernels are imported"
    assert type(unified_attention._unified_attention_kernel).__name__ == "InterpretedFunction"
    assert type(kv_cache_write._write_kv_kernel).__name__ == "InterpretedFunction"


@pytest.mark.parametrize(("device_type", "families"), [("cuda", ()), ("xpu", ()), ("npu", ("triton",))])
def test_gpu_devices_and_triton_family_are_accepted(device_type, families):
    assert TritonAttentionBackend.availability() is None
    assert TritonAttentionBackend.validate(_spec(), device_type, families) == []


def test_cpu_is_rejected_with_a_reason():
    reasons = TritonAttentionBackend.validate(_spec(), "cpu")
    assert "runs on cuda, xpu, not cpu" in reasons
    assert any("interpreter" in r and "not for serving" in r for r in reasons)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (dict(head_size=512), "head size 512 not supported"),
        (dict(head_size=60), "head size 60 not supported"),
        (dict(block_size=24), "block size 24 not supported"),
        (dict(dtype="float64"), "dtype float64 not supported"),
        (dict(kv_cache_dtype="int8"), "kv-cache dtype int8 not supported"),
        (dict(num_heads=6, num_kv_heads=4), "6 query heads do not divide into 4 kv heads"),
        (dict(sliding_window=128, causal=False), "a sliding window is only supported with causal attention"),
    ],
)
def test_unsupported_layers_are_rejected(overrides, reason):
    assert reason in " | ".join(TritonAttentionBackend.validate(_spec(**overrides), "cuda"))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(kv_cache_dtype="fp8"),
        dict(kv_cache_dtype="fp8_e5m2", dtype="float16"),
        dict(sliding_window=4096, logits_soft_cap=50.0),
        dict(head_size=80, block_size=32),
        dict(head_size=256, block_size=64, num_kv_heads=1),
        dict(causal=False, dtype="float32"),
    ],
)
def test_supported_layers_are_accepted(overrides):
    assert TritonAttentionBackend.validate(_spec(**overrides), "cuda") == []


def test_availability_explains_a_missing_triton(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "triton package is not installed" in TritonAttentionBackend.availability()
    assert any("triton package" in r for r in TritonAttentionBackend.validate(_spec(), "cuda"))


def test_plan_refuses_cpu_tensors_outside_the_interpreter(paged_case, monkeypatch):
    case = paged_case([2], device="cpu")
    monkeypatch.setitem(os.environ, "TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="not for serving"):
        TritonAttentionBackend().plan(case.batch)


def test_cache_layout_is_the_default():
    backend = TritonAttentionBackend()
    assert backend.kv_cache_shape(10, 16, 2, 64) == (2, 10, 16, 2, 64)
    assert backend.kv_cache_torch_dtype(_spec(kv_cache_dtype="fp8")) == torch.float8_e4m3fn
    assert backend.kv_cache_torch_dtype(_spec()) == torch.bfloat16


def test_query_tiles_are_built_once_per_tile_height(paged_case):
    case = paged_case([5, 1, 0, 9])
    metadata = TritonAttentionBackend().plan(case.batch)
    tiles = metadata.query_tiles(4)
    assert metadata.query_tiles(4) is tiles
    assert tiles.request.tolist() == [0, 0, 1, 3, 3, 3]
    assert tiles.start.tolist() == [0, 4, 0, 0, 4, 8]
