"""Quantization selection: confidence ranking, override, ties and the unquantized fall back; then
the per-layer kernel choice with the platform's kernel preference and recorded rejections."""

import pytest

from tokenmill.discovery import KernelTarget, PluginRegistry, SelectionError, select_kernel, select_quantizer
from tokenmill.plugin_api import LinearSpec, Platform, PlatformCapabilities, ProbeResult, Quantizer, QuantKernel


def kernel(name, reason=None):
    return type(f"{name.title()}Kernel", (QuantKernel,), {
        "name": name, "supports": classmethod(lambda cls, quantizer, spec, device_type, caps: reason)})


def quantizer(name, confidence, kernels=(), quantized=lambda spec: True):
    def detect(cls, hf_config, model_path):
        if isinstance(confidence, Exception):
            raise confidence
        return confidence(hf_config) if callable(confidence) else confidence

    return type(f"{name.title()}Quantizer", (Quantizer,), {
        "name": name, "api_version": (2, 0), "detect": classmethod(detect), "kernels": lambda self: tuple(kernels),
        "is_quantized": lambda self, spec: quantized(spec)})


def method_is(method):
    return lambda config: 1.0 if config.get("quantization_config", {}).get("quant_method") == method else 0.0


GPTQ = quantizer("gptq", method_is("gptq"))
AWQ = quantizer("awq", method_is("awq"))
MARLIN_GPTQ = quantizer("gptq_marlin", lambda config: 0.9 * method_is("gptq")(config))
UNQUANTIZED = quantizer("unquantized", 0.0)
GPTQ_CONFIG = {"quantization_config": {"quant_method": "gptq", "bits": 4}}


def registry(*quantizers):
    return PluginRegistry.make_test_instance(quantizers=quantizers, include_core=False)


def test_highest_confidence_wins_and_every_candidate_is_recorded():
    choice = select_quantizer(registry(AWQ, MARLIN_GPTQ, GPTQ, UNQUANTIZED), GPTQ_CONFIG, "/m")
    assert choice.name == "gptq" and choice.quantizer_cls is GPTQ and choice.confidence == 1.0
    assert [(c.name, c.confidence) for c in choice.candidates] == [
        ("gptq", 1.0), ("gptq_marlin", 0.9), ("awq", 0.0), ("unquantized", 0.0)]
    assert not choice.overridden and choice.notes == []


def test_override_beats_detection_with_a_note():
    choice = select_quantizer(registry(GPTQ, MARLIN_GPTQ), GPTQ_CONFIG, "/m", override="gptq_marlin")
    assert choice.name == "gptq_marlin" and choice.overridden and choice.confidence == 0.9
    assert choice.notes == ["--quantization gptq_marlin overrides the detected format gptq (confidence 1.00)"]


def test_override_that_is_not_installed_is_an_error():
    with pytest.raises(SelectionError, match=r"--quantization fp8: no such quantization format is installed \(installed: awq, gptq\)"):
        select_quantizer(registry(GPTQ, AWQ), GPTQ_CONFIG, "/m", override="fp8")


def test_override_on_a_checkpoint_that_does_not_match_says_so():
    choice = select_quantizer(registry(GPTQ, AWQ), GPTQ_CONFIG, "/m", override="awq")
    assert choice.name == "awq"
    assert "overrides the detected format gptq" in choice.notes[0]


def test_nothing_recognised_means_unquantized_with_a_note():
    choice = select_quantizer(registry(GPTQ, AWQ, UNQUANTIZED), {}, "/m")
    assert choice.name == "unquantized" and choice.confidence == 0.0
    assert "no quantization format recognised the checkpoint" in choice.notes[0]


def test_a_tie_at_the_top_is_an_error():
    twin = quantizer("gptq_v2", method_is("gptq"))
    with pytest.raises(SelectionError, match=r"tie for this checkpoint: gptq \(1.00\), gptq_v2 \(1.00\)"):
        select_quantizer(registry(GPTQ, twin), GPTQ_CONFIG, "/m")


def test_a_detect_that_raises_is_reported_and_the_others_still_rank():
    broken = quantizer("fp8", ValueError("bad header"))
    choice = select_quantizer(registry(broken, GPTQ), GPTQ_CONFIG, "/m")
    assert choice.name == "gptq"
    assert choice.notes == ["quantizer 'fp8' detect() raised ValueError: bad header"]


class SimulatedGpu(Platform):
    name = "gpu"
    device_type = "cuda"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        return ProbeResult(100)

    @property
    def capabilities(self):
        return PlatformCapabilities(dtypes=("float16",))

    def quant_kernel_preference(self):
        return ("machete", "marlin")


SPEC = LinearSpec("model.layers.0.mlp.down_proj", 4096, 1024, (1024,), False, "float16")


def test_first_supporting_kernel_wins_and_rejections_are_kept():
    fmt = quantizer("gptq", 1.0, kernels=(kernel("exllama", "needs group size 128"), kernel("triton"), kernel("torch")))()
    choice = select_kernel(fmt, SPEC, KernelTarget.of(SimulatedGpu()))
    assert choice.name == "triton"
    assert [(r.name, r.reasons) for r in choice.rejections] == [("exllama", ("needs group size 128",))]


def test_platform_kernel_preference_is_tried_first():
    kernels = (kernel("triton"), kernel("marlin"), kernel("machete", "needs Hopper-class matrix units"), kernel("torch"))
    choice = select_kernel(quantizer("gptq", 1.0, kernels=kernels)(), SPEC, KernelTarget.of(SimulatedGpu()))
    assert choice.name == "marlin"
    assert [r.name for r in choice.rejections] == ["machete"]


def test_no_kernel_is_an_error_listing_each_reason():
    kernels = (kernel("marlin", "in_features not divisible by 128"), kernel("torch", "float16 only"))
    with pytest.raises(SelectionError) as error:
        select_kernel(quantizer("gptq", 1.0, kernels=kernels)(), SPEC, KernelTarget.of(SimulatedGpu()))
    message = str(error.value)
    assert "no gptq kernel can run model.layers.0.mlp.down_proj [4096 -> 1024, float16] on gpu" in message
    assert "marlin: in_features not divisible by 128" in message and "torch: float16 only" in message


def test_layers_left_in_full_precision_run_the_unquantized_format():
    fmt = quantizer("gptq", 1.0, kernels=(kernel("torch"),), quantized=lambda spec: spec.prefix != "lm_head")()
    head = LinearSpec("lm_head", 4096, 32000, (32000,), False, "float16")
    choice = select_kernel(fmt, head, KernelTarget.of(SimulatedGpu()))
    assert choice.full_precision and choice.quantizer.name == "unquantized"
    assert choice.name == "torch-linear (full precision)"
