"""QuantizerConformance: a quantization format and its kernels checked against the format's reference kernel.

The reference kernel is the last one ``kernels()`` lists.

Subclass it in a test file::

    class TestMyFormat(QuantizerConformance):
        quantizer_cls = MyQuantizer
        hf_config = {"quantization_config": {"quant_method": "myformat", "bits": 4}}

For every kernel, layer shape (``linear_specs``) and dtype, the suite creates the layer's
parameters, fills them with random checkpoint-like values (``fill_weights``; override it when your
format constrains its tensors, e.g. GPTQ's ``g_idx``), lets the kernel repack them and compares
``apply`` on random activations with the reference kernel run on the CPU. Kernels whose
``supports`` declines a layer are skipped with that reason, except the kernels named in
``required_kernels``: a declined required kernel fails, so a kernel gated by ``supports`` (on a
capability family, an ISA feature, a device type) cannot pass the suite without having run. Set
``capabilities`` (and ``device``, or ``--tokenmill-device``) to what the platform it serves reports.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest
import torch

from tokenmill.plugin_api import LinearSpec, PlatformCapabilities, Quantizer, QuantKernel, api_version_problem
from tokenmill_testkit.tolerances import TOLERANCES


def default_linear_specs(dtype: str) -> tuple[LinearSpec, ...]:
    """A plain projection and a fused q/k/v projection with bias; in_features fit group size 128."""
    return (
        LinearSpec("model.layers.0.mlp.down_proj", 256, 128, (128,), False, dtype),
        LinearSpec("model.layers.0.self_attn.qkv_proj", 256, 256, (128, 64, 64), True, dtype),
    )


class QuantizerConformance:
    """Base class of a quantizer's conformance tests; set ``quantizer_cls`` and ``hf_config``."""

    quantizer_cls: ClassVar[type[Quantizer]]
    hf_config: ClassVar[Mapping[str, Any]] = {}  # config.json of a checkpoint in this format
    model_path: ClassVar[str] = ""
    device: ClassVar[str] = "cpu"
    capabilities: ClassVar[PlatformCapabilities] = PlatformCapabilities()  # what supports() is told
    required_kernels: ClassVar[tuple[str, ...]] = ()  # kernel names that must run, never be skipped
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16")
    tolerances: ClassVar[dict[str, tuple[float, float]]] = {}  # dtype -> (atol, rtol), relative to max |y|
    seed: ClassVar[int] = 0

    def linear_specs(self, dtype: str) -> Sequence[LinearSpec]:
        """The layer shapes to test. Override for formats with shape constraints."""
        return default_linear_specs(dtype)

    def make_quantizer(self) -> Quantizer:
        return self.quantizer_cls.from_config(self.hf_config, self.model_path)

    def fill_weights(self, layer: torch.nn.Module, spec: LinearSpec, generator: torch.Generator) -> None:
        """Give every parameter checkpoint-like random values: floats ~N(0, 0.05), tensors named
        ``*scale*`` uniform in [0.005, 0.02], integers uniform over their whole range."""
        for name, param in layer.named_parameters():
            with torch.no_grad():
                if param.dtype.is_floating_point:
                    if "scale" in name:
                        values = torch.rand(param.shape, generator=generator) * 0.015 + 0.005
                    else:
                        values = torch.randn(param.shape, generator=generator) * 0.05
                    param.copy_(values.to(param.dtype))
                else:
                    info = torch.iinfo(param.dtype)
                    values = torch.randint(info.min, info.max, param.shape, generator=generator, dtype=torch.int64)
                    param.copy_(values.to(param.dtype))

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "kernel_index" in metafunc.fixturenames:
            kernels = self.make_quantizer().kernels()
            metafunc.parametrize("kernel_index", range(len(kernels)), ids=[k.name for k in kernels])
        if "dtype" in metafunc.fixturenames:
            metafunc.parametrize("dtype", list(self.dtypes))
        if "spec_index" in metafunc.fixturenames:
            specs = self.linear_specs(self.dtypes[0])
            metafunc.parametrize("spec_index", range(len(specs)), ids=[s.prefix.rsplit(".", 1)[-1] for s in specs])

    @pytest.fixture
    def target_device(self, request: pytest.FixtureRequest) -> torch.device:
        return torch.device(request.config.getoption("tokenmill_device", default=None) or self.device)

    # -- format ---------------------------------------------------------------------------------

    def test_declarations(self) -> None:
        cls = self.quantizer_cls
        assert isinstance(cls.name, str) and cls.name, "quantizer_cls.name must be a non-empty string"

    def test_api_version_declared_and_compatible(self) -> None:
        """The class itself declares the plugin API it is built against, and this core loads it."""
        problem = api_version_problem(self.quantizer_cls)
        assert problem is None, f"{self.quantizer_cls.__qualname__} {problem}"

    def test_detect_is_a_confidence(self) -> None:
        for config in (self.hf_config, {}):
            confidence = self.quantizer_cls.detect(config, self.model_path)
            assert isinstance(confidence, float) and 0.0 <= confidence <= 1.0, f"detect({config}) = {confidence!r}"
        if self.hf_config:
            assert self.quantizer_cls.detect(self.hf_config, self.model_path) > 0, "detect() must claim hf_config"

    def test_kernels_listed(self) -> None:
        kernels = self.make_quantizer().kernels()
        assert isinstance(kernels, tuple) and kernels, "kernels() must list at least the reference kernel"
        assert all(isinstance(k, type) and issubclass(k, QuantKernel) for k in kernels), kernels
        names = [k.name for k in kernels]
        assert all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names), names

    def test_create_weights(self, dtype: str, spec_index: int) -> None:
        spec = self.linear_specs(dtype)[spec_index]
        layer = torch.nn.Module()
        self.make_quantizer().create_weights(layer, spec)
        params = dict(layer.named_parameters())
        assert params, "create_weights() registered no parameters"
        for name, param in params.items():
            assert not param.requires_grad, f"parameter {name} must have requires_grad=False"
            output_dim = getattr(param, "output_dim", None)
            assert output_dim is None or (isinstance(output_dim, int) and 0 <= output_dim < param.dim()), \
                f"parameter {name} has output_dim {output_dim!r} for shape {tuple(param.shape)}"

    def test_required_kernels_run(self, target_device: torch.device) -> None:
        """Every kernel in ``required_kernels`` is one of ``kernels()`` and accepts every layer shape and
        dtype of the suite under ``capabilities`` on the target device (so its comparisons all run)."""
        quantizer = self.make_quantizer()
        by_name = {kernel.name: kernel for kernel in quantizer.kernels()}
        unknown = [name for name in self.required_kernels if name not in by_name]
        assert not unknown, f"required_kernels names {unknown}, which kernels() does not list ({sorted(by_name)})"
        declined = []
        for name in self.required_kernels:
            for dtype in self.dtypes:
                for spec in self.linear_specs(dtype):
                    reason = by_name[name].supports(quantizer, spec, target_device.type, self.capabilities)
                    if reason:
                        declined.append(f"{name} declines {spec.prefix} ({dtype}) on {target_device.type}: {reason}")
        assert not declined, "a required kernel would be skipped: " + "; ".join(declined)

    # -- kernels --------------------------------------------------------------------------------

    def test_kernel_matches_reference(self, kernel_index: int, dtype: str, spec_index: int,
                                      target_device: torch.device) -> None:
        quantizer = self.make_quantizer()
        kernels = quantizer.kernels()
        kernel_cls, reference_cls = kernels[kernel_index], kernels[-1]
        spec = self.linear_specs(dtype)[spec_index]
        declined = kernel_cls.supports(quantizer, spec, target_device.type, self.capabilities)
        if declined:
            if kernel_cls.name in self.required_kernels:
                pytest.fail(f"required kernel {kernel_cls.name} declines {spec.prefix} on {target_device.type}: {declined}")
            pytest.skip(f"{kernel_cls.name} declines {spec.prefix}: {declined}")
        reference_declined = reference_cls.supports(quantizer, spec, "cpu", PlatformCapabilities())
        if reference_declined:
            pytest.skip(f"the reference kernel {reference_cls.name} cannot run on the CPU: {reference_declined}")

        generator = torch.Generator().manual_seed(self.seed)
        layer = torch.nn.Module()
        quantizer.create_weights(layer, spec)
        self.fill_weights(layer, spec, generator)
        reference_layer = copy.deepcopy(layer)
        layer.to(target_device)
        kernel, reference = kernel_cls(), reference_cls()
        kernel.process_weights_after_loading(layer)
        reference.process_weights_after_loading(reference_layer)

        torch_dtype = getattr(torch, dtype)
        bias = torch.randn(spec.out_features, generator=generator).to(torch_dtype) if spec.bias else None
        for shape in ((5, spec.in_features), (2, 3, spec.in_features)):
            x = torch.randn(*shape, generator=generator).to(torch_dtype)
            out = kernel.apply(layer, x.to(target_device), None if bias is None else bias.to(target_device))
            want = reference.apply(reference_layer, x, bias)
            self._check(out, want, shape, spec, torch_dtype, f"{kernel_cls.name} on input {shape}")

    def _check(self, out: Any, want: torch.Tensor, shape: tuple[int, ...], spec: LinearSpec, dtype: torch.dtype,
               what: str) -> None:
        assert isinstance(out, torch.Tensor), f"{what}: apply() returned {type(out).__name__}"
        assert tuple(out.shape) == (*shape[:-1], spec.out_features), f"{what}: output shape {tuple(out.shape)}"
        assert out.dtype == dtype, f"{what}: output dtype {out.dtype}, expected {dtype}"
        atol, rtol = {**TOLERANCES, **self.tolerances}.get(spec.dtype, TOLERANCES["float32"])
        expected = want.detach().float().cpu()
        error = (out.detach().float().cpu() - expected).abs().max().item()
        limit = atol + rtol * expected.abs().max().item()
        assert error <= limit, f"{what}: max |error| {error:.3g} exceeds {limit:.3g} (reference max |y| " \
            f"{expected.abs().max().item():.3g})"
