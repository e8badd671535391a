"""Attention-backend selection: platform preference order, capability rejections with reasons,
the --attention-backend override and the fall back to the reference backend (only when allowed)."""

import pytest

from tokenmill.discovery import PluginRegistry, SelectionError, select_attention_backend
from tokenmill.plugin_api import (
    AttentionBackend,
    AttentionCapabilities,
    AttentionSpec,
    Platform,
    PlatformCapabilities,
    ProbeResult,
)


def backend(name, **capabilities):
    return type(f"{name.title()}Backend", (AttentionBackend,), {
        "name": name, "api_version": (2, 0), "capabilities": AttentionCapabilities(**capabilities)})


class SimulatedGpu(Platform):
    name = "gpu"
    device_type = "cuda"
    api_version = (2, 0)

    @classmethod
    def probe(cls):
        return ProbeResult(100, ("simulated",))

    @property
    def capabilities(self):
        return PlatformCapabilities(dtypes=("bfloat16", "float16"), families=("triton",))

    def attention_preference(self):
        return ("flash", "paged", "triton")


FLASH = backend("flash", device_types=("cuda",), dtypes=("float16", "bfloat16"), head_sizes=(64, 128), sliding_window=False)
PAGED = backend("paged", device_types=("cuda",), dtypes=("float16", "bfloat16"), block_sizes=(16, 32))
TRITON = backend("triton", device_types=("xpu",), families=("triton",), dtypes=("float16", "bfloat16", "float32"))
REFERENCE = backend("reference", device_types=("cpu", "cuda"), dtypes=("float32", "float16", "bfloat16"))


def spec(**changes):
    base = dict(num_heads=8, num_kv_heads=2, head_size=64, scale=0.125, dtype="bfloat16")
    return AttentionSpec(**{**base, **changes})


def registry(*backends):
    return PluginRegistry.make_test_instance(attention_backends=backends, include_core=False)


def test_first_preferred_backend_that_validates_wins():
    choice = select_attention_backend(registry(FLASH, PAGED, TRITON), SimulatedGpu(), spec())
    assert choice.name == "flash" and choice.backend_cls is FLASH and choice.rejections == []


def test_rejections_keep_every_reason_in_preference_order():
    choice = select_attention_backend(registry(FLASH, PAGED, TRITON), SimulatedGpu(),
                                      spec(head_size=96, sliding_window=4096, block_size=64))
    assert choice.name == "triton"  # runs on cuda through the platform's "triton" family tag
    assert [r.name for r in choice.rejections] == ["flash", "paged"]
    assert choice.rejections[0].reasons == ("head size 96 not supported", "sliding-window attention not supported")
    assert choice.rejections[1].reasons == ("block size 64 not supported (supports (16, 32))",)


def test_a_preferred_backend_that_is_not_installed_is_a_rejection():
    choice = select_attention_backend(registry(PAGED), SimulatedGpu(), spec())
    assert choice.name == "paged"
    assert choice.rejections[0].name == "flash"
    assert choice.rejections[0].reasons == ("not installed (installed: paged)",)


def test_an_unavailable_backend_is_rejected_with_its_availability_reason():
    missing = type("FlashBackend", (FLASH,), {"api_version": (2, 0), "availability": classmethod(lambda cls: "flash_attn is not installed")})
    choice = select_attention_backend(registry(missing, PAGED), SimulatedGpu(), spec())
    assert choice.name == "paged"
    assert choice.rejections[0].reasons == ("unavailable: flash_attn is not installed",)


def test_running_on_an_unpreferred_reference_backend_needs_the_allow_flag():
    with pytest.raises(SelectionError) as error:
        select_attention_backend(registry(FLASH, REFERENCE), SimulatedGpu(), spec(dtype="float32"))
    assert str(error.value).startswith("no attention backend preferred by platform gpu (flash, paged, triton) can "
                                       "serve this model on gpu (cuda); pass --allow-attention-fallback to run it on "
                                       "core's reference backend:\n  - flash: dtype float32 not supported")
    choice = select_attention_backend(registry(FLASH, REFERENCE), SimulatedGpu(), spec(dtype="float32"),
                                      allow_fallback=True)
    assert choice.name == "reference"
    assert [r.name for r in choice.rejections] == ["flash", "paged", "triton"]
    assert choice.warnings == ["no attention backend preferred by platform gpu (flash, paged, triton) can serve this "
                               "model; running on core's reference backend (--allow-attention-fallback)"]


def test_no_backend_at_all_lists_every_rejection():
    with pytest.raises(SelectionError) as error:
        select_attention_backend(registry(FLASH), SimulatedGpu(), spec(head_size=80))
    message = str(error.value)
    assert "no attention backend can serve this model on gpu (cuda)" in message
    assert "flash: head size 80 not supported" in message
    assert "reference: not installed" in message


def test_override_wins_over_the_preference():
    choice = select_attention_backend(registry(FLASH, PAGED), SimulatedGpu(), spec(), override="paged")
    assert choice.name == "paged" and choice.overridden and choice.rejections == []


def test_override_that_cannot_serve_the_spec_is_an_error_with_reasons():
    with pytest.raises(SelectionError, match="(?s)--attention-backend flash cannot serve.*head size 96 not supported"):
        select_attention_backend(registry(FLASH, PAGED), SimulatedGpu(), spec(head_size=96), override="flash")
    with pytest.raises(SelectionError, match="not installed"):
        select_attention_backend(registry(FLASH), SimulatedGpu(), spec(), override="flashinfer")


def test_a_validate_that_raises_is_a_rejection_not_a_crash():
    def validate(cls, spec, device_type, families=()):
        raise KeyError("compute capability")

    broken = type("FlashBackend", (FLASH,), {"api_version": (2, 0), "validate": classmethod(validate)})
    choice = select_attention_backend(registry(broken, PAGED), SimulatedGpu(), spec())
    assert choice.name == "paged"
    assert choice.rejections[0].reasons == ("validate() raised KeyError: 'compute capability'",)
