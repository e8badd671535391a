"""The two context objects models receive, passed explicitly (no globals):

* ``ModelBuildContext`` once, at construction: dtype, device, quantizer, platform facts for kernel
  choice, and the KV-cache settings attention layers put in their ``AttentionSpec``;
* ``AttentionContext`` every step: the attention backend, its planned metadata and the caches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenmill.discovery.kernel_choice import KernelChoice, KernelTarget, select_kernel
from tokenmill.layers.embedding import LMHead, VocabEmbedding
from tokenmill.plugin_api import (
    AttentionBackend,
    AttentionSpec,
    LayerKernels,
    LinearSpec,
    Platform,
    PlatformCapabilities,
    Quantizer,
    QuantKernel,
)
from tokenmill.plugin_api.linear import Linear
from tokenmill.reference.unquantized import Unquantized


@dataclass
class AttentionContext:
    """One step's attention state, shared by every layer: ``kv_caches[i]`` is layer ``i``'s cache
    and ``metadata`` is what ``backend.plan`` returned for the step's batch."""

    backend: AttentionBackend
    metadata: Any
    kv_caches: list[Any]


class AttentionSpecError(ValueError):
    """The attention backend cannot serve a layer of the model."""


@dataclass
class ModelBuildContext:
    """Everything a model constructor needs besides the Hugging Face config.

    ``quantizer`` None means unquantized. ``attention_backend``, when set, validates every
    layer's AttentionSpec as it is built. ``layer_kernels`` (the platform's, or None for core's
    PyTorch code) runs RMSNorm, rotary embedding and SiluAndMul; ``build_model`` hands it to them.
    ``linear_kernels`` are the platform's own kernels for plain float weights (``Platform.linear_kernels``).
    ``kernel_choices`` records the linear kernel chosen for each layer prefix (with the reasons faster
    kernels were rejected) for the startup report.
    """

    dtype: torch.dtype | str = torch.float32
    device: torch.device | str = "cpu"
    quantizer: Quantizer | None = None
    platform_name: str = "reference"
    device_type: str = "cpu"
    capabilities: PlatformCapabilities = field(default_factory=PlatformCapabilities)
    kernel_preference: tuple[str, ...] = ()
    linear_kernels: tuple[type[QuantKernel], ...] = ()
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    attention_backend: type[AttentionBackend] | None = None
    layer_kernels: LayerKernels | None = None
    kernel_choices: dict[str, KernelChoice] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.dtype, str):
            self.dtype = getattr(torch, self.dtype)
        self.device = torch.device(self.device)
        self._unquantized = Unquantized()

    @classmethod
    def for_platform(cls, platform: Platform, *, dtype: torch.dtype | str, quantizer: Quantizer | None = None,
                     block_size: int = 16, kv_cache_dtype: str = "auto",
                     attention_backend: type[AttentionBackend] | None = None) -> ModelBuildContext:
        """A context for an activated platform: its device, capabilities, kernel preference and own
        linear kernels."""
        return cls(dtype=dtype, device=platform.torch_device(), quantizer=quantizer, platform_name=platform.name,
                   device_type=platform.device_type, capabilities=platform.capabilities,
                   kernel_preference=tuple(platform.quant_kernel_preference()),
                   linear_kernels=tuple(platform.linear_kernels()), block_size=block_size,
                   kv_cache_dtype=kv_cache_dtype, attention_backend=attention_backend,
                   layer_kernels=platform.layer_kernels())

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def _linear_parts(self, spec: LinearSpec, quantized: bool) -> tuple[Quantizer, Any]:
        quantizer = self.quantizer if quantized and self.quantizer is not None else self._unquantized
        target = KernelTarget(self.platform_name, self.device_type, self.capabilities, self.kernel_preference,
                              self.linear_kernels)
        choice = select_kernel(quantizer, spec, target)
        self.kernel_choices[spec.prefix] = choice
        return choice.quantizer, choice.kernel()

    def linear(self, prefix: str, in_features: int, output_sizes: Sequence[int], bias: bool = False) -> Linear:
        """A Linear named ``prefix`` (the module path, e.g. ``model.layers.0.self_attn.qkv_proj``)
        fused from shards of ``output_sizes``, in the quantizer's format when it quantizes it."""
        spec = LinearSpec(prefix, in_features, sum(output_sizes), tuple(output_sizes), bias, self.dtype_name)
        quantizer, kernel = self._linear_parts(spec, quantized=True)
        return Linear(spec, quantizer, kernel)

    def lm_head(self, vocab_size: int, hidden_size: int, tied_to: VocabEmbedding | None = None,
                prefix: str = "lm_head") -> LMHead:
        """The output projection; with ``tied_to`` it shares the embedding's weight (unquantized),
        unless the quantizer keeps its own copy of a tied head (``quantizes_tied_lm_head``)."""
        spec = LinearSpec(prefix, hidden_size, vocab_size, (vocab_size,), False, self.dtype_name)
        if tied_to is not None and self.quantizer is not None and self.quantizer.quantizes_tied_lm_head(spec):
            tied_to = None
        quantizer, kernel = self._linear_parts(spec, quantized=tied_to is None)
        return LMHead(spec, quantizer, kernel, tied_to=tied_to)

    def attention_spec(self, num_heads: int, num_kv_heads: int, head_size: int, *, scale: float | None = None,
                       sliding_window: int | None = None, logits_soft_cap: float | None = None,
                       causal: bool = True) -> AttentionSpec:
        """An AttentionSpec with this context's dtype and cache settings, validated against
        ``attention_backend`` when one is set."""
        spec = AttentionSpec(
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
            scale=head_size**-0.5 if scale is None else scale, dtype=self.dtype_name,
            kv_cache_dtype=self.kv_cache_dtype, block_size=self.block_size, sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap, causal=causal,
        )
        if self.attention_backend is not None:
            reasons = self.attention_backend.validate(spec, self.device_type, self.capabilities.families)
            if reasons:
                raise AttentionSpecError(f"attention backend {self.attention_backend.name!r} cannot run this model's "
                                         f"attention ({spec}): {'; '.join(reasons)}")
        return spec

    def kernel_summary(self) -> dict[str, int]:
        """How many linear layers each chosen kernel runs, e.g. ``{"torch-linear": 29}``."""
        return dict(Counter(choice.kernel.name for choice in self.kernel_choices.values()))
