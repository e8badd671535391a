"""The safetensors loader: single and sharded checkpoints, dtype conversion, tied heads, and clear
errors for missing weights, pickles, missing tensors and shape mismatches."""

import json
from collections.abc import Iterator

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

from tokenmill.layers.context import ModelBuildContext
from tokenmill.loader.model_loader import MissingWeightsError, build_model, load_model, load_weights
from tokenmill.models.weight_mapping import CheckpointMismatchError
from tokenmill.plugin_api.safetensors_checkpoint import CheckpointNotFoundError, SafetensorsCheckpoint
from tokenmill.reference.unquantized import TorchLinearKernel, Unquantized

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2)


def save_tiny(path, **overrides):
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**CONFIG, **overrides)).eval()
    hf.save_pretrained(path, safe_serialization=True, **({"max_shard_size": "20KB"} if "shard" in path.name else {}))
    return hf


def rewrite(path, change):
    """Apply ``change`` to the tensors of the single-file checkpoint at ``path``."""
    file = path / "model.safetensors"
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def qkv_of(model, layer):
    return model.model.layers[layer].self_attn.qkv_proj.weight


def test_sharded_checkpoint_loads_lazily_and_completely(tmp_path):
    path = tmp_path / "shard"
    hf = save_tiny(path)
    checkpoint = SafetensorsCheckpoint(path)
    assert len(checkpoint.files) > 1
    assert set(checkpoint.names()) == set(hf.state_dict())
    assert isinstance(checkpoint.tensors(), Iterator)
    model = load_model(AutoConfig.from_pretrained(path), str(path), ModelBuildContext())
    attn = hf.model.layers[1].self_attn
    want = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    assert torch.equal(qkv_of(model, 1), want)


def test_dtype_is_converted_on_copy_and_dict_configs_work(tmp_path):
    hf = save_tiny(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    model = build_model(config, ModelBuildContext(dtype="bfloat16"))
    load_weights(model, str(tmp_path))
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(model.lm_head.weight, hf.lm_head.weight.to(torch.bfloat16))


def test_tied_checkpoint_that_also_ships_lm_head_is_tolerated(tmp_path):
    hf = save_tiny(tmp_path, tie_word_embeddings=True)
    rewrite(tmp_path, lambda t: t.__setitem__("lm_head.weight", torch.full((64, 32), 7.0)))
    model = load_model(AutoConfig.from_pretrained(tmp_path), str(tmp_path), ModelBuildContext())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, hf.model.embed_tokens.weight)


def test_missing_tensor_names_the_parameter(tmp_path):
    save_tiny(tmp_path)
    rewrite(tmp_path, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(MissingWeightsError, match=r"does not provide 1 of the model's \d+ parameters.*"
                                                  r"model\.layers\.1\.self_attn\.qkv_proj\.weight"):
        load_model(AutoConfig.from_pretrained(tmp_path), str(tmp_path), ModelBuildContext())


def test_shape_mismatch_names_the_checkpoint_tensor(tmp_path):
    save_tiny(tmp_path)
    rewrite(tmp_path, lambda t: t.__setitem__("model.layers.0.mlp.up_proj.weight", torch.zeros(40, 32)))
    with pytest.raises(CheckpointMismatchError, match=r"'model.layers.0.mlp.up_proj.weight' cannot be loaded into "
                                                      r"model.layers.0.mlp.gate_up_proj.weight: checkpoint shape "
                                                      r"\(40, 32\) does not fit the parameter's \(48, 32\)"):
        load_model(AutoConfig.from_pretrained(tmp_path), str(tmp_path), ModelBuildContext())


def test_directories_without_safetensors_are_refused(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no weights found"):
        SafetensorsCheckpoint(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(CheckpointNotFoundError, match="only pickle weights.*never loads pickles"):
        SafetensorsCheckpoint(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        SafetensorsCheckpoint(tmp_path / "nope")


def test_index_listing_a_missing_shard_is_reported(tmp_path):
    path = tmp_path / "shard"
    save_tiny(path)
    shards = sorted(path.glob("model-*.safetensors"))
    shards[0].unlink()
    with pytest.raises(CheckpointNotFoundError, match=f"lists shards that are not in .*{shards[0].name}"):
        SafetensorsCheckpoint(path)


def test_a_format_can_supply_its_own_tensors(tmp_path):
    hf = save_tiny(tmp_path)
    state = {name: tensor * 2 for name, tensor in hf.state_dict().items()}

    class SelfSupplied(Unquantized):
        def weights(self, model_path):
            assert model_path == "in-memory"
            return iter(state.items())

    config = AutoConfig.from_pretrained(tmp_path)
    model = load_model(config, "in-memory", ModelBuildContext(quantizer=SelfSupplied()))
    assert torch.equal(model.model.norm.weight, hf.model.norm.weight * 2)


class RecordingKernel(TorchLinearKernel):
    name = "recording-linear"
    finished: list = []

    def process_weights_after_loading(self, layer):
        self.finished.append(layer.spec.prefix)


class WithActivationScales(Unquantized):
    """Unquantized weights plus a per-layer ``input_scale`` a checkpoint may or may not carry."""

    def __init__(self, optional):
        self.optional = optional

    def kernels(self):
        return (RecordingKernel,)

    def is_quantized(self, spec):
        return True

    def create_weights(self, layer, spec):
        super().create_weights(layer, spec)
        scale = torch.nn.Parameter(torch.ones(()), requires_grad=False)
        scale.checkpoint_optional = self.optional
        layer.register_parameter("input_scale", scale)


def test_optional_parameters_and_kernel_finishing(tmp_path):
    save_tiny(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    RecordingKernel.finished.clear()
    model = load_model(config, str(tmp_path), ModelBuildContext(quantizer=WithActivationScales(optional=True)))
    assert model.model.layers[0].mlp.down_proj.input_scale == 1.0
    assert "model.layers.1.self_attn.qkv_proj" in RecordingKernel.finished and "lm_head" in RecordingKernel.finished
    with pytest.raises(MissingWeightsError, match="input_scale"):
        load_model(config, str(tmp_path), ModelBuildContext(quantizer=WithActivationScales(optional=False)))
