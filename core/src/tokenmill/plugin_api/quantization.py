"""The Quantizer contract, in two roles.

* A **format** (``Quantizer``): recognises a checkpoint (``detect`` with a confidence), parses its
  quantization config (``from_config``), creates the layer's parameters under the checkpoint's own
  names (``create_weights``) and may supply the checkpoint's tensors itself (``weights``, for files
  such as GGUF that are not safetensors).
* **Kernels** (``QuantKernel``) for that format: each says whether it can run a given layer on the
  active platform (``supports``, with a reason when not), repacks the loaded weights once
  (``process_weights_after_loading``) and computes ``y = x W^T + b`` (``apply``). Every format
  lists a plain-PyTorch reference kernel last, the path of last resort and the correctness oracle.

All calls happen in the engine process, during model construction and loading, except ``detect``,
which selection may call in any process.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tokenmill.plugin_api.platform import PlatformCapabilities


@dataclass(frozen=True)
class LinearSpec:
    """One linear layer as the model builds it: ``out_features`` is the fused total, split into
    ``output_sizes`` shards (e.g. q, k, v) that the checkpoint stores separately."""

    prefix: str  # module path, e.g. "model.layers.0.self_attn.qkv_proj"
    in_features: int
    out_features: int
    output_sizes: tuple[int, ...]
    bias: bool
    dtype: str  # activation / compute dtype name


class QuantKernel:
    """One way to run a quantized linear layer on some hardware."""

    name: ClassVar[str]
    """Unique short name shown in ``tokenmill plugins explain``. Required."""

    plain_weight: ClassVar[bool] = False
    """True when ``apply`` computes ``x @ layer.weight.T (+ bias)`` from a plain floating-point
    ``weight`` [out, in] (no scales, no packing), so core may hand that weight to other kernels
    (a platform's ``greedy_lm_head``). Optional (plugin API 1.6; default False)."""

    @classmethod
    def supports(cls, quantizer: Quantizer, spec: LinearSpec, device_type: str, caps: PlatformCapabilities) -> str | None:
        """Why this kernel cannot run ``spec`` here, or None when it can. Optional (default: can).
        Called while the model is built, once per layer shape."""
        return None

    def process_weights_after_loading(self, layer: Any) -> None:
        """Repack ``layer``'s loaded parameters into this kernel's layout. Optional (default:
        nothing). Called once per layer after all checkpoint tensors were copied in."""

    def apply(self, layer: Any, x: Any, bias: Any | None) -> Any:
        """Return ``x @ W.T (+ bias)`` for activations ``x`` [..., in_features]. Required;
        called every forward pass."""
        raise NotImplementedError


class Quantizer:
    """Base class for a quantization format plugin."""

    name: ClassVar[str]
    """The format name users pass to ``--quantization`` ("gptq", "fp8", "gguf"). Required."""

    api_version: ClassVar[tuple[int, int]]
    """The plugin API version the plugin was built against, e.g. ``(2, 0)``. Required, in the body of
    the class the entry point names (an inherited value does not count); checked at discovery."""

    @classmethod
    def detect(cls, hf_config: Mapping[str, Any], model_path: str) -> float:
        """Confidence in [0, 1] that the checkpoint at ``model_path`` (with config.json contents
        ``hf_config``, possibly empty) is in this format. Required. Must be cheap: read the config
        or a file header, never the weights. The highest confidence above 0 wins."""
        return 0.0

    @classmethod
    def from_config(cls, hf_config: Mapping[str, Any], model_path: str) -> Quantizer:
        """Parse the format's settings from the checkpoint and return a configured instance.
        Optional; default ``cls()``. Raise ``ValueError`` with a clear message on a bad config."""
        return cls()

    def kernels(self) -> tuple[type[QuantKernel], ...]:
        """Kernel classes for this format, best first; the last should be the torch reference.
        Required."""
        raise NotImplementedError

    def is_quantized(self, spec: LinearSpec) -> bool:
        """Whether the layer is stored quantized (e.g. GPTQ leaves ``lm_head`` in full precision).
        Optional; default True."""
        return True

    def quantizes_tied_lm_head(self, spec: LinearSpec) -> bool:
        """Whether an ``lm_head`` tied to the input embedding gets its own weights in this format
        (``create_weights`` with ``spec``, loaded from ``weights``) instead of sharing the embedding's
        float matrix, e.g. GGUF's packed layout reading the embedding's blocks. Optional (since plugin
        API 1.2); default False."""
        return False

    def create_weights(self, layer: Any, spec: LinearSpec) -> None:
        """Register ``layer``'s parameters (as ``torch.nn.Parameter`` with ``requires_grad=False``)
        under the names the checkpoint uses. A parameter that is concatenated across fused shards
        carries an ``output_dim`` attribute (the dimension that holds ``out_features``) and, when
        packed along it, a ``pack_factor`` attribute. Required; called while the model is built."""
        raise NotImplementedError

    def weights(self, model_path: str) -> Iterator[tuple[str, Any]] | None:
        """The checkpoint's tensors as (Hugging Face parameter name, tensor) pairs, or None to let
        core read safetensors files. Optional (default None). Called once at load time."""
        return None

    def hf_config(self, model_path: str) -> dict[str, Any] | None:
        """A transformers-style config dict when the checkpoint carries its own (GGUF metadata),
        or None to read config.json. Optional (default None)."""
        return None

    def tokenizer(self, model_path: str) -> Any | None:
        """A Hugging Face tokenizer built from the checkpoint itself, or None to load one from
        ``model_path``. Optional (default None)."""
        return None

    def describe(self) -> str:
        """One line describing the parsed settings, for the startup report. Optional."""
        return self.name

    @classmethod
    def quantize_checkpoint(cls, model_dir: str, out_dir: str, **options: Any) -> Mapping[str, Any]:
        """Write a copy of the float Hugging Face checkpoint ``model_dir`` (config.json + safetensors)
        to ``out_dir`` with its decoder linear layers in this format, and return the
        ``quantization_config`` written into ``out_dir/config.json``. ``options`` are the keyword-only
        parameters the method declares, or the function it wraps with ``functools.wraps``
        (``tokenmill quantize`` passes only those, e.g. ``bits``, ``group_size``, ``method``); raise
        ``ValueError`` for a model or option the format cannot take. Optional (since plugin API 1.1); the default says the format cannot be written."""
        raise NotImplementedError(f"the {cls.name} format cannot write checkpoints")
