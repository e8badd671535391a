"""paged_attention_forward: the transformers ``AttentionInterface`` function backed by tokenmill's paged attention.

Registered with transformers so that a Hugging Face model's own attention modules call the step's
attention backend.

Transformers models call ``attention_interface(module, query, key, value, attention_mask, *,
scaling, sliding_window, softcap, ...)`` with ``query`` [1, heads, T, head_size] and
``key``/``value`` [1, kv_heads, T, head_size] for a flat batch of T tokens. Each attention module
carries a ``LayerRoute`` (attached by ``TransformersCausalLM``) naming its layer index, its
AttentionSpec and the model's ``StepBinding``.

Invariant: the step's AttentionContext reaches the function only through ``StepBinding.bind``,
entered once per model forward and never nested (a nested or concurrent forward of the same model
raises instead of letting two steps share or overwrite one context). Outside a bound step the
function raises. Before routes exist, ``SpecProbe.active`` records what each attention module
asks for (heads, scale, window, soft-cap) from one tiny forward; that is how the per-layer
specs are learnt without knowing the architecture.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from tokenmill.layers.context import AttentionContext
from tokenmill.plugin_api import AttentionSpec

ATTN_IMPLEMENTATION = "tokenmill_paged"
ROUTE_ATTRIBUTE = "_tokenmill_route"


class StepBinding:
    """The AttentionContext of the step a model is running, bound for the length of one forward."""

    def __init__(self) -> None:
        self._ctx: AttentionContext | None = None
        self._lock = threading.Lock()

    @contextmanager
    def bind(self, ctx: AttentionContext) -> Iterator[None]:
        """Make ``ctx`` the current step's context; raises if a step is already bound."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("a transformers-fallback model was entered while it was already running a step "
                               "(nested or concurrent forward); each step must finish first")
        self._ctx = ctx
        try:
            yield
        finally:
            self._ctx = None
            self._lock.release()

    @property
    def ctx(self) -> AttentionContext:
        if self._ctx is None:
            raise RuntimeError("transformers attention ran outside a tokenmill step (no AttentionContext bound)")
        return self._ctx


@dataclass(frozen=True)
class LayerRoute:
    """Where one Hugging Face attention module sends its queries."""

    binding: StepBinding
    layer_index: int
    spec: AttentionSpec


@dataclass(frozen=True)
class AttentionCall:
    """What one attention module asked for during the probe forward."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    value_head_size: int
    scaling: float | None
    sliding_window: int | None
    softcap: float | None
    causal: bool


@dataclass
class SpecProbe:
    """Records the attention calls of one forward, in call order, keyed by module."""

    calls: dict[nn.Module, AttentionCall] = field(default_factory=dict)
    repeated: list[str] = field(default_factory=list)

    _current: ClassVar[SpecProbe | None] = None  # the probe recording right now, if any

    @classmethod
    @contextmanager
    def active(cls) -> Iterator[SpecProbe]:
        """Record attention calls made inside the block (not nestable)."""
        if SpecProbe._current is not None:
            raise RuntimeError("an attention probe is already running")
        probe = cls()
        SpecProbe._current = probe
        try:
            yield probe
        finally:
            SpecProbe._current = None

    def record(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               kwargs: dict[str, Any]) -> None:
        if module in self.calls:
            self.repeated.append(type(module).__name__)
            return
        window = kwargs.get("sliding_window")
        self.calls[module] = AttentionCall(
            num_heads=query.shape[1], num_kv_heads=key.shape[1], head_size=query.shape[-1],
            value_head_size=value.shape[-1], scaling=kwargs.get("scaling"),
            sliding_window=int(window) if window else None, softcap=kwargs.get("softcap") or None,
            causal=bool(getattr(module, "is_causal", True)))


UNSUPPORTED_ARGUMENTS = ("s_aux", "sinks")


def paged_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over tokenmill's paged attention: writes this
    step's keys/values into the layer's cache and returns ([1, T, heads, head_size], None)."""
    for name in UNSUPPORTED_ARGUMENTS:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"{type(module).__name__} passes {name!r} to attention, which tokenmill's "
                                      f"paged attention does not support")
    route: LayerRoute | None = module.__dict__.get(ROUTE_ATTRIBUTE)
    if route is None:
        probe = SpecProbe._current
        if probe is None:
            raise RuntimeError(f"{type(module).__name__} is not wired to tokenmill's paged attention")
        probe.record(module, query, key, value, kwargs)
        return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None
    if query.shape[0] != 1:
        raise ValueError(f"the transformers fallback runs flat batches [1, T]; got batch size {query.shape[0]}")
    ctx = route.binding.ctx
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, heads, head_size]
    out = ctx.backend.forward(route.spec, q, k.contiguous(), v.contiguous(), ctx.kv_caches[route.layer_index],
                              ctx.metadata)
    return out.unsqueeze(0), None


def register_attention_function() -> str:
    """Register ``paged_attention_forward`` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
