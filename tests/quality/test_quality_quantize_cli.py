"""``tokenmill quantize`` end to end on a tiny random Llama: every format's checkpoint decodes (by
each format's reference arithmetic) to weights close to the originals, loads in tokenmill with the
same log-probabilities transformers computes from those weights, keeps norms and embeddings in
float, copies the tokenizer; bad options fail with one clear line; ``plugins explain`` shows the
Triton kernels rejected on the CPU."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tokenmill.cli.main import main

TOKENS = [1, 504, 3458, 282, 260, 2365, 28, 314, 1848, 253, 1345, 30, 378, 1083, 2004, 11, 17, 4327]

# key: (options, bound on each linear weight's relative error, tolerance of the engine's log-probabilities
# against transformers on the decoded weights: W8A8 also rounds activations, which the oracle does not)
FORMATS = {
    "gptq": (["--format", "gptq", "--group-size", "64", "--desc-act", "--no-sym"], 0.15, 2e-4),
    "gptq-rtn": (["--format", "gptq", "--method", "rtn", "--bits", "8"], 0.01, 2e-4),
    "awq": (["--format", "awq", "--group-size", "64"], 0.15, 2e-4),
    "fp8": (["--format", "fp8"], 0.07, 2e-4),
    "fp8-block-gptq": (["--format", "fp8", "--weight-block-size", "64", "--method", "gptq"], 0.07, 2e-4),
    "int8": (["--format", "int8"], 0.01, 2e-4),
    "int8-w8a8": (["--format", "int8", "--activations", "dynamic"], 0.01, 2e-2),
}
CALIBRATED = ("gptq", "awq", "fp8-block-gptq")


@pytest.fixture(scope="module")
def quantized(tiny_llama, tmp_path_factory):
    """Each FORMATS entry written by the CLI once: {key: output directory}."""
    root = tmp_path_factory.mktemp("quantized")
    made = {}
    for key, (options, _, _) in FORMATS.items():
        calibration = ["--calibration-sequences", "4"] if key in CALIBRATED else []
        assert main(["quantize", str(tiny_llama), str(root / key), *options, *calibration]) == 0
        made[key] = root / key
    return made


@pytest.mark.parametrize("key", list(FORMATS))
def test_checkpoint_decodes_near_the_float_weights(key, quantized, tiny_llama, dequantize):
    original = load_file(str(tiny_llama / "model.safetensors"))
    state = dequantize(quantized[key])
    linear = [n for n in original if n.endswith("_proj.weight")]
    assert len(linear) == 14
    for name in linear:
        error = (state[name] - original[name]).norm() / original[name].norm()
        assert error < FORMATS[key][1], f"{name}: relative error {error:.3f}"
    for name in set(original) - set(linear):
        if key == "awq" and "layernorm" in name:
            continue  # AWQ folds its scales into the norms
        assert torch.equal(state[name], original[name].float()), name


@pytest.mark.parametrize("key", list(FORMATS))
def test_tokenmill_matches_transformers_on_the_decoded_weights(key, quantized, dequantize, reference_logprobs,
                                                               engine_logprobs):
    directory = quantized[key]
    want = reference_logprobs(directory, dequantize(directory), TOKENS)
    got = engine_logprobs(directory, [TOKENS])[0]
    torch.testing.assert_close(got, want, atol=FORMATS[key][2], rtol=0)


def test_awq_scales_keep_the_float_model(tiny_llama, quantized, dequantize):
    """Folding AWQ's scales into the norms leaves the float function unchanged: norms divided by
    ``s`` times weight columns multiplied by ``s`` give back the products of the originals."""
    original = load_file(str(tiny_llama / "model.safetensors"))
    state = dequantize(quantized["awq"])
    for layer in range(2):
        norm = f"model.layers.{layer}.input_layernorm.weight"
        scales = original[norm] / state[norm]
        assert not torch.allclose(scales, torch.ones_like(scales))
        folded = state[f"model.layers.{layer}.self_attn.q_proj.weight"] / scales
        error = (folded - original[f"model.layers.{layer}.self_attn.q_proj.weight"]).norm()
        assert error / original[f"model.layers.{layer}.self_attn.q_proj.weight"].norm() < 0.15


def test_output_directory_layout(tiny_llama, quantized):
    directory = quantized["gptq"]
    config = json.loads((directory / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": True, "sym": False,
        "checkpoint_format": "gptq", "lm_head": False, "true_sequential": False, "damp_percent": 0.1,
        "quantizer": "tokenmill (gptq)"}
    assert config["hidden_size"] == 128
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (directory / name).read_bytes() == (tiny_llama / name).read_bytes()
    stored = load_file(str(directory / "model.safetensors"))
    assert stored["model.layers.0.mlp.down_proj.qweight"].shape == (256 // 8, 128)
    assert stored["model.layers.0.mlp.down_proj.g_idx"].shape == (256,)
    assert not any(n.startswith("lm_head") for n in stored)  # tied to the embedding, as in the source
    assert stored["model.embed_tokens.weight"].dtype == torch.float32


def test_fp8_block_checkpoint_loads_in_transformers(quantized, dequantize):
    """transformers' fine-grained FP8 reads the block layout (dequantizing on the CPU)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(quantized["fp8-block-gptq"], dtype=torch.float32).eval()
    weight = model.model.layers[1].mlp.down_proj.weight.float()
    torch.testing.assert_close(weight, dequantize(quantized["fp8-block-gptq"])["model.layers.1.mlp.down_proj.weight"])


@pytest.mark.parametrize("options, message", [
    (["--format", "nope"], "no installed quantization format named 'nope' can write checkpoints (formats: awq, fp8, "
                           "gptq, int8)"),
    (["--format", "fp8", "--bits", "4"], "the fp8 format does not take --bits (it takes: --weight-block-size, "
                                         "--method, --desc-act"),
    (["--format", "int8", "--method", "gptq"], "the int8 format does not take --method"),
    (["--format", "gptq", "--bits", "5"], "GPTQ bits=5 is not supported"),
    (["--format", "gptq", "--method", "rtn", "--desc-act"], "act order (--desc-act) orders columns by activation "
                                                            "statistics: it needs --method gptq"),
    (["--format", "awq", "--group-size", "96"], "AWQ needs inputs divisible by the group size 96 and outputs "
                                                "divisible by 8; --group-size 128 fits every layer"),
    (["--format", "awq", "--method", "gptq"], "AWQ method 'gptq' is not one of awq, rtn"),
])
def test_bad_options_are_one_error_line(tiny_llama, tmp_path, capsys, options, message):
    assert main(["quantize", str(tiny_llama), str(tmp_path / "out"), *options]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_refuses_its_own_input_and_quantized_sources(tiny_llama, quantized, tmp_path, capsys):
    assert main(["quantize", str(tiny_llama), str(tiny_llama), "--format", "int8"]) == 1
    assert "is the model directory" in capsys.readouterr().err
    assert main(["quantize", str(quantized["int8"]), str(tmp_path / "again"), "--format", "int8"]) == 1
    assert "already quantized (int8)" in capsys.readouterr().err
    assert main(["quantize", str(tiny_llama), str(quantized["int8"]), "--format", "int8"]) == 1
    assert "already holds model weights" in capsys.readouterr().err


@pytest.mark.parametrize("key, triton, chosen", [("gptq", "gptq-triton", "gptq-torch"),
                                                 ("awq", "awq-triton", "awq-torch")])
def test_explain_shows_triton_rejected_on_the_cpu(key, triton, chosen, quantized, capsys):
    assert main(["plugins", "explain", "--model", str(quantized[key]), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    kernels = out[out.index("linear kernels:"):]
    assert kernels.count(f"rejected {triton}: on the CPU Triton runs only as its slow interpreter") == 4
    assert kernels.count(f"] {chosen}") == 4
    assert "lm_head" in kernels and "(full precision)" in kernels


def test_calibration_file_and_window_options(tiny_llama, tmp_path, capsys):
    text = tmp_path / "calibration.txt"
    text.write_text("The river ran under the old stone bridge and on toward the sea. " * 20, encoding="utf-8")
    options = ["--format", "awq", "--calibration-file", str(text), "--calibration-sequences", "2",
               "--calibration-length", "32"]
    assert main(["quantize", str(tiny_llama), str(tmp_path / "custom"), *options]) == 0
    assert "awq (bits=4, group_size=128" in capsys.readouterr().out
    missing = ["--format", "gptq", "--calibration-file", str(tmp_path / "absent.txt")]
    assert main(["quantize", str(tiny_llama), str(tmp_path / "missing"), *missing]) == 1
    assert "calibration file" in capsys.readouterr().err
    long = ["--format", "gptq", "--calibration-file", str(text), "--calibration-length", "5000"]
    assert main(["quantize", str(tiny_llama), str(tmp_path / "long"), *long]) == 1
    assert "fewer than one window of 5000" in capsys.readouterr().err
