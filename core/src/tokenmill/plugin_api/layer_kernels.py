"""LayerKernels: fused kernels a platform may supply for the small per-token layers.

A decode step of a small model on a CPU runs tens of tiny tensor operations per layer (a residual
add and RMSNorm, rotary embedding, the gated activation); each costs a dispatcher call, which adds
up to more than the matrix products (those are the linear kernels': a platform offers its own through
``Platform.linear_kernels``). A platform returns a ``LayerKernels`` from
``Platform.layer_kernels()`` (plugin API 1.2) to run each of them as one call. Every method returns
its result, or None when it does not handle these inputs (a dtype, a layout): core then runs its own
PyTorch code, which is also the reference the kernels are tested against. Results must match that
code up to rounding (the order of floating-point sums, the evaluation of functions such as exp).
"""

from __future__ import annotations

from typing import Any, ClassVar


class LayerKernels:
    """Base class: every method declines (returns None)."""

    name: ClassVar[str] = "torch"
    """Short name shown in the startup report."""

    def rms_norm(self, x: Any, weight: Any, eps: float, residual: Any | None = None) -> Any | None:
        """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension of ``x`` [T, hidden]. With
        ``residual``, normalise ``x + residual`` and return ``(normed, x + residual)``. Optional;
        called by every RMSNorm in every forward pass."""
        return None

    def rotary(self, query: Any, key: Any, cos: Any, sin: Any) -> tuple[Any, Any] | None:
        """Rotate the first ``2 * cos.shape[-1]`` features of each head of ``query`` [T, heads, head_size]
        and ``key`` [T, kv_heads, head_size] (NeoX halves: ``(x1 cos - x2 sin, x2 cos + x1 sin)``) by
        the step's ``cos`` / ``sin`` [T, 1, rotary_dim / 2]; returns new ``(query, key)``. Optional."""
        return None

    def silu_and_mul(self, x: Any) -> Any | None:
        """``silu(gate) * up`` for ``x`` [T, 2 * d] laid out as ``(gate, up)``. Optional."""
        return None

    def gather_rows(self, table: Any, indices: Any) -> Any | None:
        """``table[indices]``: a new [T, D] tensor of the rows of ``table`` [N, D] at int64 ``indices``
        [T], same dtype (token embeddings, the step's rotary angles). Raises IndexError for an index
        outside ``[0, N)``. Optional (plugin API 1.3)."""
        return None

    def argmax_rows(self, logits: Any) -> Any | None:
        """``torch.argmax(logits, dim=-1)`` as int64 [N] for float32 ``logits`` [N, V]: the first index of
        each row's maximum, or of its first NaN. Optional (plugin API 1.6); asked by the sampler for
        greedy rows."""
        return None

    def greedy_lm_head(self, hidden: Any, weight: Any) -> Any | None:
        """Each row's argmax (int64 [N]) of the float32 logits ``hidden @ weight.T``, ``hidden`` [N, K] and
        ``weight`` [V, K] float32, without necessarily computing every logit. The answer must be the
        argmax of the float32 product up to that product's rounding: a token whose exact logit exceeds
        every other by more than the float32 product's rounding error must be the one returned.
        Optional (plugin API 1.6); asked for steps whose rows are all greedy, without logprobs or
        logits processors."""
        return None
