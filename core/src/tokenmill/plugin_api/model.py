"""The model contract: what a registered model class implements and what it is given.

A plugin registers models through the ``register_models`` hook ({architecture: "module:Class"}).
Core constructs the class as ``cls(hf_config, build)`` with a ``BuildContext``, loads the
checkpoint through ``load_weights`` and then calls ``forward`` every step with a ``StepContext``.
Core checks the constructed model against ``Model`` (``isinstance``, the protocol is runtime
checkable) and names the members it lacks; it never probes for optional members.

Tensors are torch tensors; the contract names them ``Any`` so this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from tokenmill.plugin_api.attention import AttentionBackend, AttentionSpec
from tokenmill.plugin_api.layer_kernels import LayerKernels
from tokenmill.plugin_api.platform import PlatformCapabilities
from tokenmill.plugin_api.quantization import Quantizer


class BuildContext(Protocol):
    """What a model's constructor receives besides the Hugging Face config (core passes its
    ``ModelBuildContext``). Layers are built through it so the quantizer, the platform's kernel
    choice and the attention backend's validation apply to every one of them."""

    dtype: Any
    """The compute dtype (a ``torch.dtype``)."""
    device: Any
    """The ``torch.device`` parameters are created on."""
    quantizer: Quantizer | None
    """The checkpoint's quantizer, None when unquantized."""
    device_type: str
    """The platform's device type, e.g. ``"cpu"``."""
    capabilities: PlatformCapabilities
    """The platform's declared capabilities."""
    block_size: int
    """Tokens per KV-cache block."""
    kv_cache_dtype: str
    """``"auto"`` (the compute dtype) or an fp8 cache dtype name."""
    attention_backend: type[AttentionBackend] | None
    """The selected attention backend class; set, it validates every ``attention_spec``."""
    layer_kernels: LayerKernels | None
    """The platform's fused norm / rotary / activation kernels, None for core's PyTorch code."""

    def linear(self, prefix: str, in_features: int, output_sizes: Sequence[int], bias: bool = False) -> Any:
        """A linear layer (an ``nn.Module``) named ``prefix``, fused from shards of ``output_sizes``,
        in the quantizer's format when it quantizes it."""
        ...

    def lm_head(self, vocab_size: int, hidden_size: int, tied_to: Any = None, prefix: str = "lm_head") -> Any:
        """The output projection (an ``nn.Module`` with ``greedy_token_ids``); with ``tied_to`` (the
        input embedding) it shares that weight."""
        ...

    def attention_spec(self, num_heads: int, num_kv_heads: int, head_size: int, *, scale: float | None = None,
                       sliding_window: int | None = None, logits_soft_cap: float | None = None,
                       causal: bool = True) -> AttentionSpec:
        """An AttentionSpec with the context's dtype and cache settings; raises ``ValueError`` when
        the attention backend cannot serve it."""
        ...


class StepContext(Protocol):
    """One step's attention state, passed to ``Model.forward`` and shared by every layer
    (core passes its ``AttentionContext``)."""

    backend: AttentionBackend
    """The attention backend instance of the engine."""
    metadata: Any
    """What ``backend.plan`` returned for this step's batch."""
    kv_caches: list[Any]
    """Layer ``i``'s cache tensor at index ``i`` (the order of ``Model.attention_specs``)."""


@runtime_checkable
class Model(Protocol):
    """A registered model: constructed as ``cls(hf_config, build: BuildContext)``; every member
    below is stated by the class (no defaults are assumed)."""

    is_encoder: bool
    """True for encoder-only embedding models (``EncoderModel``): no KV cache, no decode steps."""
    default_pooling: Any
    """How ``LLM.embed`` pools this model's hidden states when the checkpoint declares no pooling
    (core's ``PoolingConfig``)."""

    def forward(self, input_ids: Any, positions: Any, ctx: StepContext) -> Any:
        """Hidden states [T, hidden] of a flat step batch: ``input_ids`` and ``positions`` int64 [T]."""
        ...

    def compute_logits(self, hidden: Any) -> Any:
        """Float32 logits [N, vocab] for the rows of ``hidden`` [N, hidden] the caller selected."""
        ...

    def greedy_token_ids(self, hidden: Any) -> Any | None:
        """``compute_logits(hidden).argmax(-1)`` as int64 [N] when the model can find it without
        every logit (greedy steps without logprobs), else None (core then computes the logits)."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        """Copy (Hugging Face name, tensor) pairs into the parameters; returns the names now loaded."""
        ...

    def attention_specs(self) -> list[AttentionSpec]:
        """One AttentionSpec per attention layer, indexed like ``StepContext.kv_caches``."""
        ...


@runtime_checkable
class EncoderModel(Model, Protocol):
    """An encoder-only model (``is_encoder`` True): it embeds whole sequences without paged attention."""

    def embed_hidden(self, input_ids: Any, positions: Any, seq_lens: Sequence[int]) -> Any:
        """Hidden states [T, hidden] of whole sequences laid end to end (lengths ``seq_lens``)."""
        ...


def missing_members(model: object) -> list[str]:
    """The members of ``Model`` (and of ``EncoderModel`` for an encoder) that ``model`` lacks."""
    required = ["is_encoder", "default_pooling", "forward", "compute_logits", "greedy_token_ids", "load_weights",
                "attention_specs"]
    if getattr(model, "is_encoder", False):
        required.append("embed_hidden")
    return [name for name in required if not hasattr(model, name)]
