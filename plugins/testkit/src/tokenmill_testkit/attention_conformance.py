"""AttentionBackendConformance: an attention backend checked against core's reference backend.

Subclass it in a test file::

    class TestMyBackend(AttentionBackendConformance):
        backend_cls = MyBackend
        device = "cpu"           # or "cuda:0"; ``pytest --tokenmill-device=...`` overrides it
        families = ("mydev",)    # the family tags of the platform the backend runs on

Every combination of layer shape (``attention_cases``), dtype (``dtypes``) and batch mix
(``batch_mixes``: prefill only, decode only, mixed, prefix-cache hit) runs as its own test: the
backend plans and runs each step exactly as the engine would, and its outputs must match the
reference's within the dtype's tolerance. Combinations the backend's ``validate`` rejects are
skipped with its reasons. When the backend keeps the default cache layout, the cache contents at
every written slot must equal the reference's exactly; a custom layout is checked through later
steps, which must read back what earlier steps wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import pytest
import torch

from tokenmill.plugin_api import AttentionBackend, AttentionCapabilities, AttentionSpec, api_version_problem
from tokenmill_testkit.attention_cases import DEFAULT_CASES, DEFAULT_MIXES, AttentionCase, BatchMix
from tokenmill_testkit.attention_scenario import AttentionScenario, LayerRun
from tokenmill_testkit.tolerances import assert_close, tolerance


def _reference_backend() -> type[AttentionBackend]:
    from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend

    return ReferenceAttentionBackend


class AttentionBackendConformance:
    """Base class of an attention backend's conformance tests; set ``backend_cls``."""

    backend_cls: ClassVar[type[AttentionBackend]]
    device: ClassVar[str] = "cpu"
    device_type: ClassVar[str | None] = None  # passed to validate(); default: the torch device's type
    families: ClassVar[tuple[str, ...]] = ()
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")
    tolerances: ClassVar[dict[str, tuple[float, float]]] = {}  # dtype -> (atol, rtol) overrides
    seed: ClassVar[int] = 0

    def attention_cases(self) -> Sequence[AttentionCase]:
        """The layer shapes to test. Override to add the shapes your models use."""
        return DEFAULT_CASES

    def batch_mixes(self) -> dict[str, Callable[[int], BatchMix]]:
        """Batch mixes by name, each built for a block size. Override to add your own."""
        return DEFAULT_MIXES

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "attention_case" in metafunc.fixturenames:
            cases = list(self.attention_cases())
            metafunc.parametrize("attention_case", cases, ids=[case.id for case in cases])
        if "dtype" in metafunc.fixturenames:
            metafunc.parametrize("dtype", list(self.dtypes))
        if "mix" in metafunc.fixturenames:
            metafunc.parametrize("mix", list(self.batch_mixes()))

    @pytest.fixture
    def target_device(self, request: pytest.FixtureRequest) -> torch.device:
        return torch.device(request.config.getoption("tokenmill_device", default=None) or self.device)

    def _device_type(self, device: torch.device) -> str:
        return self.device_type or device.type

    def _require_support(self, spec: AttentionSpec, device: torch.device) -> None:
        reasons = self.backend_cls.validate(spec, self._device_type(device), self.families)
        if reasons:
            pytest.skip(f"{self.backend_cls.name} rejects this layer: {'; '.join(reasons)}")
        reference_reasons = _reference_backend().validate(replace(spec, dtype="float32"), "cpu")
        if reference_reasons:
            pytest.skip(f"the reference backend cannot check this layer: {'; '.join(reference_reasons)}")

    # -- declarations ---------------------------------------------------------------------------

    def test_declarations(self) -> None:
        cls = self.backend_cls
        assert isinstance(cls.name, str) and cls.name, "backend_cls.name must be a non-empty string"
        assert isinstance(cls.capabilities, AttentionCapabilities)
        unavailable = cls.availability()
        assert unavailable is None or isinstance(unavailable, str)

    def test_api_version_declared_and_compatible(self) -> None:
        """The class itself declares the plugin API it is built against, and this core loads it."""
        problem = api_version_problem(self.backend_cls)
        assert problem is None, f"{self.backend_cls.__qualname__} {problem}"

    def test_validate_reasons_are_strings(self, attention_case: AttentionCase, dtype: str,
                                          target_device: torch.device) -> None:
        reasons = self.backend_cls.validate(attention_case.spec(dtype), self._device_type(target_device), self.families)
        assert isinstance(reasons, list), f"validate() returned {type(reasons).__name__}, not a list of reasons"
        assert all(isinstance(r, str) and r for r in reasons), f"reasons must be non-empty strings: {reasons!r}"

    def test_validate_agrees_with_capabilities(self, target_device: torch.device) -> None:
        """What ``capabilities`` declares unsupported, ``validate`` must reject: selection filters
        on the declaration without importing kernels, explanations quote ``validate``."""
        caps = self.backend_cls.capabilities
        base = DEFAULT_CASES[1].spec(caps.dtypes[0] if caps.dtypes else "float32")
        unsupported = {"dtype float64": replace(base, dtype="float64")}
        if "fp8_e5m2" not in caps.kv_cache_dtypes:
            unsupported["kv-cache dtype fp8_e5m2"] = replace(base, kv_cache_dtype="fp8_e5m2")
        if not caps.sliding_window:
            unsupported["sliding window"] = replace(base, sliding_window=8)
        if not caps.logits_soft_cap:
            unsupported["soft cap"] = replace(base, logits_soft_cap=2.0)
        if not caps.non_causal:
            unsupported["non-causal"] = replace(base, causal=False)
        if caps.head_sizes is not None:
            unsupported["head size 17"] = replace(base, head_size=17)
        accepted = [what for what, spec in unsupported.items()
                    if not self.backend_cls.validate(spec, self._device_type(target_device), self.families)]
        assert not accepted, f"validate() accepts what capabilities declare unsupported: {', '.join(accepted)}"

    def test_supports_some_case(self, target_device: torch.device) -> None:
        rejected = {}
        for case in self.attention_cases():
            for dtype in self.dtypes:
                reasons = self.backend_cls.validate(case.spec(dtype), self._device_type(target_device), self.families)
                if not reasons:
                    return
                rejected[f"{case.id}/{dtype}"] = reasons
        pytest.fail(f"{self.backend_cls.name} rejects every tested layer on {target_device}: {rejected}")

    def test_kv_cache_shape(self, target_device: torch.device) -> None:
        backend = self.backend_cls(target_device)
        shape = backend.kv_cache_shape(4, 16, 2, 64)
        assert isinstance(shape, tuple) and all(isinstance(n, int) and n > 0 for n in shape), shape
        bigger = backend.kv_cache_shape(8, 16, 2, 64)
        assert torch.Size(bigger).numel() > torch.Size(shape).numel(), "the cache must grow with num_blocks"

    # -- numerics -------------------------------------------------------------------------------

    def test_forward_matches_reference(self, attention_case: AttentionCase, dtype: str, mix: str,
                                       target_device: torch.device) -> None:
        spec = attention_case.spec(dtype)
        self._require_support(spec, target_device)
        scenario = self._scenario(mix, attention_case, dtype, num_layers=1)
        self._check_against_reference(scenario, [spec], target_device)

    def test_metadata_shared_by_layers(self, dtype: str, target_device: torch.device) -> None:
        """One ``plan`` per step serves every layer, even layers with different specs (a global
        layer and a sliding-window layer, as Gemma alternates them)."""
        case = AttentionCase(4, 2, 64)
        specs = [case.spec(dtype), replace(case, sliding_window=8).spec(dtype)]
        if self.backend_cls.validate(specs[1], self._device_type(target_device), self.families):
            specs[1] = specs[0]
        for spec in specs:
            self._require_support(spec, target_device)
        scenario = self._scenario("mixed", case, dtype, num_layers=2)
        self._check_against_reference(scenario, specs, target_device)

    def _scenario(self, mix: str, case: AttentionCase, dtype: str, num_layers: int) -> AttentionScenario:
        return AttentionScenario(self.batch_mixes()[mix](case.block_size), case.num_heads, case.num_kv_heads,
                                 case.head_size, case.block_size, dtype, num_layers=num_layers, seed=self.seed)

    def _check_against_reference(self, scenario: AttentionScenario, specs: list[AttentionSpec],
                                 device: torch.device) -> None:
        backend = self.backend_cls(device)
        reference = _reference_backend()(torch.device("cpu"))
        runs = scenario.run(backend, specs, device)
        expected = scenario.run(reference, [replace(s, dtype="float32") for s in specs], torch.device("cpu"))
        for layer, (spec, run, ref) in enumerate(zip(specs, runs, expected, strict=True)):
            atol, rtol = tolerance(spec.dtype, spec.kv_cache_dtype, self.tolerances)
            for step, (out, want) in enumerate(zip(run.outputs, ref.outputs, strict=True)):
                where = f"layer {layer}, step {step} of mix '{scenario.mix.name}'"
                self._check_output(out, want, spec, device, where)
                assert_close(out, want, atol, rtol, f"attention output, {where}")
            if spec.kv_cache_dtype == "auto" and self._default_layout(scenario, run):
                self._check_cache(scenario, run, ref, f"layer {layer}")

    @staticmethod
    def _check_output(out: Any, want: torch.Tensor, spec: AttentionSpec, device: torch.device, where: str) -> None:
        assert isinstance(out, torch.Tensor), f"forward returned {type(out).__name__}, {where}"
        assert tuple(out.shape) == tuple(want.shape), f"output shape {tuple(out.shape)} != {tuple(want.shape)}, {where}"
        assert out.dtype == getattr(torch, spec.dtype), f"output dtype {out.dtype}, expected {spec.dtype}, {where}"
        assert out.device.type == device.type, f"output on {out.device}, expected {device}, {where}"

    @staticmethod
    def _default_layout(scenario: AttentionScenario, run: LayerRun) -> bool:
        default = (2, scenario.num_blocks, scenario.block_size, scenario.num_kv_heads, scenario.head_size)
        return tuple(run.cache.shape) == default

    @staticmethod
    def _check_cache(scenario: AttentionScenario, run: LayerRun, ref: LayerRun, where: str) -> None:
        slots = scenario.written_slots()
        flat_shape = (2, scenario.num_blocks * scenario.block_size, scenario.num_kv_heads, scenario.head_size)
        written = run.cache.detach().cpu().reshape(flat_shape)[:, slots].float()
        wanted = ref.cache.reshape(flat_shape)[:, slots].float()
        assert_close(written, wanted, 0.0, 0.0, f"KV cache contents at the written slots, {where}")
