"""Linear: a (possibly fused) linear layer whose weights belong to a quantizer and whose math
belongs to one of that quantizer's kernels.

Core builds every linear layer of a model as this class, so it is the layer a quantizer's
``create_weights`` and a kernel's ``process_weights_after_loading`` / ``apply`` receive, and the loading
rules below are part of the plugin contract; quantizer tests build one to load checkpoint shards
exactly as core does.

A fused layer (q/k/v, gate/up) concatenates the checkpoint's separate tensors along each
parameter's ``output_dim``; ``load_shard`` puts one checkpoint tensor in its place.

Parameter attributes the loader honours (set by ``Quantizer.create_weights``):

* ``output_dim``: the dimension that holds ``out_features``; shard ``i`` occupies
  ``sum(output_sizes[:i]) : sum(output_sizes[:i+1])`` along it, divided by ``pack_factor``.
* ``pack_factor``: how many output features one stored element packs along ``output_dim``.
* ``per_shard``: dim 0 has one entry per fused shard (e.g. per-tensor scales); shard ``i`` is row ``i``.
* ``weight_loader(param, tensor, shard_index)``: a callable that replaces all of the above.
* ``checkpoint_optional``: the checkpoint may lack the tensor (its created value is kept).

A parameter with none of ``output_dim`` / ``per_shard`` is loaded whole from every shard (g_idx).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from tokenmill.plugin_api.quantization import LinearSpec, Quantizer, QuantKernel


def shard_range(output_sizes: Sequence[int], shard_index: int) -> tuple[int, int]:
    """(offset, size) of shard ``shard_index`` along the fused output dimension."""
    if not 0 <= shard_index < len(output_sizes):
        raise ValueError(f"shard {shard_index} does not exist in a layer fused from {len(output_sizes)} shards")
    return sum(output_sizes[:shard_index]), output_sizes[shard_index]


def load_shard(param: torch.Tensor, loaded: torch.Tensor, shard_index: int | None = None,
               output_sizes: Sequence[int] = ()) -> None:
    """Copy checkpoint tensor ``loaded`` into ``param`` (converting its dtype), into the slice of
    shard ``shard_index`` of a fused layer whose shards have ``output_sizes``, or whole when
    ``shard_index`` is None. Raises ``ValueError`` when the shapes do not fit."""
    custom = getattr(param, "weight_loader", None)
    if custom is not None:
        custom(param, loaded, shard_index)
        return
    target = param.data
    if shard_index is not None:
        output_dim = getattr(param, "output_dim", None)
        if getattr(param, "per_shard", False):
            target = target[shard_index]
        elif output_dim is not None:
            offset, size = shard_range(output_sizes, shard_index)
            pack = getattr(param, "pack_factor", 1)
            if offset % pack or size % pack:
                raise ValueError(f"shard {shard_index} ({size} features at {offset}) is not a multiple of the "
                                 f"pack factor {pack}")
            target = target.narrow(output_dim, offset // pack, size // pack)
    if target.shape != loaded.shape:
        if target.numel() == loaded.numel() == 1:
            loaded = loaded.reshape(target.shape)
        else:
            where = "" if shard_index is None else f" (shard {shard_index})"
            raise ValueError(f"checkpoint shape {tuple(loaded.shape)} does not fit the parameter's "
                             f"{tuple(target.shape)}{where}")
    target.copy_(loaded)


class Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` in the quantizer's layout and the product computed by ``kernel``.

    The quantizer registers the weight parameters under the checkpoint's names; the layer adds a
    full-precision ``bias`` [out_features] (``output_dim = 0``) when ``spec.bias`` is set.
    """

    def __init__(self, spec: LinearSpec, quantizer: Quantizer, kernel: QuantKernel, *, create_weights: bool = True):
        super().__init__()
        self.spec = spec
        self.quantizer = quantizer
        self.kernel = kernel
        if create_weights:
            quantizer.create_weights(self, spec)
        if spec.bias and "bias" not in self._parameters:
            bias = nn.Parameter(torch.zeros(spec.out_features, dtype=getattr(torch, spec.dtype)), requires_grad=False)
            bias.output_dim = 0
            self.register_parameter("bias", bias)
        elif not spec.bias:
            self.register_parameter("bias", None)

    @property
    def num_shards(self) -> int:
        """How many checkpoint tensors the layer fuses (``len(spec.output_sizes)``)."""
        return len(self.spec.output_sizes)

    def load_weight(self, param_name: str, loaded: torch.Tensor, shard_index: int | None = None) -> None:
        """Copy checkpoint tensor ``loaded`` into parameter ``param_name``: shard ``shard_index`` of a
        fused layer, or the whole parameter when None (an unfused layer, or a checkpoint that
        already stores the fused tensor)."""
        param = self._parameters.get(param_name)
        if param is None:
            raise KeyError(f"{self.spec.prefix} has no parameter {param_name!r}")
        load_shard(param, loaded, shard_index, self.spec.output_sizes)

    def process_weights_after_loading(self) -> None:
        """Let the kernel repack the loaded weights into its own layout."""
        self.kernel.process_weights_after_loading(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T (+ bias)`` through the kernel, for activations ``x`` [..., in_features]."""
        return self.kernel.apply(self, x, self.bias)

    def extra_repr(self) -> str:
        """Shapes, bias, quantizer and kernel, for ``print(model)``."""
        spec = self.spec
        return (f"{spec.in_features} -> {spec.output_sizes}, bias={spec.bias}, quantizer={self.quantizer.name}, "
                f"kernel={self.kernel.name}")

