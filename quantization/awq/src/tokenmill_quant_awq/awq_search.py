"""AWQ's activation-aware scale search (Lin et al., 2023), layer by layer on calibration text.

Weights that meet large activations matter most, so before rounding, each input channel ``c`` of
a group of linears sharing one input is scaled by ``s_c`` (``W[:, c] *= s_c``) and the op that
produces the input is divided by it (an RMSNorm's weight, or the rows of the linear before), which
leaves the float model unchanged. Per group, ``s = mean|x|^r / mean|w|^(1-r)`` (normalised to a
geometric mean of 1) with ``r`` on a grid in [0, 1) chosen to minimise the squared error of the
group's outputs on a sample of calibration rows after round-to-nearest (AutoAWQ's search, with
the linears' outputs as the loss). Groups of the llama layout:

* ``input_layernorm`` -> ``q_proj, k_proj, v_proj``;
* ``v_proj`` -> ``o_proj`` (only when their shapes match, i.e. without grouped-query attention);
* ``post_attention_layernorm`` -> ``gate_proj, up_proj``;
* ``up_proj`` -> ``down_proj``.

Each layer is then left with its rounded weights, so later layers calibrate against its errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tokenmill.plugin_api.quantize_tools import FloatCheckpoint, LayerwiseRunner, one_thread

# model types whose decoder layers have the llama layout and norms that multiply by their weight
LLAMA_LAYOUT = ("llama", "mistral", "qwen2", "qwen3")
GROUPS = (
    ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("self_attn.v_proj", ("self_attn.o_proj",)),
    ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
    ("mlp.up_proj", ("mlp.down_proj",)),
)
GRID = 20
SEARCH_ROWS = 256


def fake_quantize(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """Round-to-nearest 4-bit with a zero point per group, dequantized (``quantize_awq``'s arithmetic)."""
    out_features, in_features = weight.shape
    grouped = weight.reshape(out_features, -1, group_size)
    high, low = grouped.amax(-1, keepdim=True), grouped.amin(-1, keepdim=True)
    scales = ((high - low).clamp(min=1e-5) / 15).to(torch.float16).to(torch.float32)
    zeros = torch.clamp(-torch.round(low / scales), 0, 15)
    q = torch.clamp(torch.round(grouped / scales) + zeros, 0, 15)
    return ((q - zeros) * scales).reshape(out_features, in_features)


def search_scales(inputs: torch.Tensor, input_mean: torch.Tensor, weights: list[torch.Tensor],
                  group_size: int) -> torch.Tensor:
    """The input-channel scales ``s`` [in] minimising ``sum ||x W^T - x (Q(W s) / s)^T||^2`` over the
    sample rows ``inputs`` [rows, in]; ``input_mean`` [in] is ``mean|x|`` over all calibration rows."""
    with one_thread():  # a grid of mid-sized ops: threads stall more than they help on a busy machine
        return _search(inputs, input_mean, torch.cat(weights), group_size)


def _search(inputs: torch.Tensor, input_mean: torch.Tensor, stacked: torch.Tensor, group_size: int) -> torch.Tensor:
    normalised = stacked.abs().reshape(-1, group_size)
    normalised = normalised / normalised.amax(dim=1, keepdim=True).clamp(min=1e-12)
    weight_mean = normalised.reshape(stacked.shape).mean(0)
    reference = inputs @ stacked.T
    best, best_error = torch.ones_like(input_mean), float("inf")
    for step in range(GRID):
        ratio = step / GRID
        scales = (input_mean.pow(ratio) / weight_mean.pow(1 - ratio).clamp(min=1e-4)).clamp(min=1e-4)
        scales = scales / (scales.max() * scales.min()).sqrt()
        rounded = fake_quantize(stacked * scales, group_size) / scales
        error = float(((inputs @ rounded.T - reference) ** 2).mean())
        if error < best_error:
            best, best_error = scales, error
    return best


def awq_search(source: FloatCheckpoint, names: list[str], windows: torch.Tensor,
               group_size: int) -> dict[str, torch.Tensor]:
    """Scale-searched float weights to round: ``{name: weight}`` for the linears ``names`` and for
    the norm weights the scales were folded into (everything else in ``source`` is unchanged)."""
    model_type = source.config.get("model_type")
    if model_type not in LLAMA_LAYOUT:
        raise ValueError(f"AWQ's scale search knows the llama layer layout ({', '.join(LLAMA_LAYOUT)}), not "
                         f"{model_type!r}; use --method rtn")
    targets = set(names)
    changed: dict[str, torch.Tensor] = {}

    def visit(prefix: str, layer: nn.Module, feed: Callable[[], None]) -> None:
        modules = dict(layer.named_modules())
        groups = [(prev, linears) for prev, linears in GROUPS
                  if prev in modules and all(f"{prefix}.{n}.weight" in targets for n in linears)
                  and _foldable(modules[prev], modules[linears[0]])]
        if len(groups) < 3:
            raise ValueError(f"{prefix} does not have the llama layout AWQ's scale search expects; use --method rtn")
        statistics = _input_statistics({linears[0]: modules[linears[0]] for _, linears in groups}, feed)
        for prev, linears in groups:
            sample, mean = statistics[linears[0]]
            weights = [modules[n].weight for n in linears]
            scales = search_scales(sample, mean, weights, group_size)
            for name in linears:
                modules[name].weight.mul_(scales)
            previous = modules[prev]
            previous.weight.div_(scales.view(-1, 1) if isinstance(previous, nn.Linear) else scales)
            if not isinstance(previous, nn.Linear):
                changed[f"{prefix}.{prev}.weight"] = previous.weight.detach().clone()
        for name, module in modules.items():
            if f"{prefix}.{name}.weight" in targets:
                changed[f"{prefix}.{name}.weight"] = module.weight.detach().clone()
                module.weight.copy_(fake_quantize(module.weight, group_size))

    LayerwiseRunner(source.path, windows).run(visit)
    missing = sorted(targets - set(changed))
    if missing:
        raise ValueError(f"AWQ's scale search did not reach {len(missing)} linear weights, e.g. {missing[0]}; "
                         "use --method rtn for this model")
    return changed


def _foldable(previous: nn.Module, first: nn.Module) -> bool:
    """Whether ``previous``'s output is exactly ``first``'s input channel for channel."""
    if isinstance(previous, nn.Linear):
        return previous.out_features == first.in_features
    weight = getattr(previous, "weight", None)
    return weight is not None and weight.shape == (first.in_features,)


def _input_statistics(modules: dict[str, nn.Module], feed: Callable[[], None]) -> dict[str, Any]:
    """Per module: (sample of ``SEARCH_ROWS`` input rows, mean |x| per channel over all rows)."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    samples: dict[str, list[torch.Tensor]] = {}

    def hook(name: str, inputs: torch.Tensor) -> None:
        rows = inputs.detach().reshape(-1, inputs.shape[-1]).to(torch.float32)
        sums[name] = sums.get(name, 0) + rows.abs().sum(0)
        counts[name] = counts.get(name, 0) + rows.shape[0]
        samples.setdefault(name, []).append(rows[:: max(1, rows.shape[0] // SEARCH_ROWS)][:SEARCH_ROWS])

    handles = [m.register_forward_hook(lambda _m, args, _out, n=name: hook(n, args[0])) for name, m in modules.items()]
    try:
        feed()
    finally:
        for handle in handles:
            handle.remove()
    result = {}
    for name in modules:
        rows = torch.cat(samples[name])
        result[name] = (rows[:: max(1, rows.shape[0] // SEARCH_ROWS)][:SEARCH_ROWS], sums[name] / counts[name])
    return result
