"""LayerwiseRunner: a Hugging Face causal LM run over calibration windows one decoder layer at a
time, for quantizers that need each layer's real inputs (GPTQ's Hessians, AWQ's activation scales).

The embedding stage runs once (the first decoder layer's inputs are captured by a pre-hook, with
the keyword arguments the model passes: rotary embeddings, masks). Then, layer by layer, a
``visit(prefix, layer, feed)`` callback may hook the layer's modules, call ``feed()`` to run the
layer over every window, and change the layer's weights (e.g. to their quantized values); the
layer is then run once more so the next layer sees the outputs of the weights as ``visit`` left
them: errors of earlier layers are what later layers are calibrated against.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tokenmill.plugin_api.quantize_tools.error_feedback import HessianAccumulator
from tokenmill.plugin_api.quantize_tools.float_checkpoint import FloatCheckpoint

Visit = Callable[[str, nn.Module, Callable[[], None]], None]
# quantize_linear(weight name, float weight [out, in], Hessian [in, in]) -> (format tensors, dequantized weight)
QuantizeLinear = Callable[[str, torch.Tensor, torch.Tensor], tuple[Any, torch.Tensor]]


class _InputsCaptured(Exception):
    """Raised by the pre-hook to stop the model once the first layer's inputs are known."""


class LayerwiseRunner:
    """The float model of ``model_dir`` and calibration ``windows`` (int64 ``[n, length]``), run in
    batches of ``batch_size`` windows."""

    def __init__(self, model_dir: str | Path, windows: torch.Tensor, batch_size: int = 8) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        self.prefix, self.layers = _decoder_layers(self.model)
        self.batches = list(windows.split(batch_size))

    def run(self, visit: Visit) -> None:
        """Call ``visit`` for every decoder layer in order (see the module docstring)."""
        with torch.no_grad():
            inputs = self._first_layer_inputs()
            for index, layer in enumerate(self.layers):
                visit(f"{self.prefix}.{index}", layer, lambda layer=layer, inputs=inputs: self._forward(layer, inputs))
                inputs = [(self._forward_one(layer, hidden, kwargs), kwargs) for hidden, kwargs in inputs]

    def _first_layer_inputs(self) -> list[tuple[torch.Tensor, dict[str, Any]]]:
        captured: list[tuple[torch.Tensor, dict[str, Any]]] = []

        def capture(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args else kwargs.pop("hidden_states")
            captured.append((hidden, dict(kwargs)))
            raise _InputsCaptured

        handle = self.layers[0].register_forward_pre_hook(capture, with_kwargs=True)
        try:
            for batch in self.batches:
                try:
                    self.model(input_ids=batch, use_cache=False)
                except _InputsCaptured:
                    pass
        finally:
            handle.remove()
        if len(captured) != len(self.batches):
            raise RuntimeError(f"captured the inputs of {len(captured)} of {len(self.batches)} calibration batches")
        return captured

    def _forward(self, layer: nn.Module, inputs: list[tuple[torch.Tensor, dict[str, Any]]]) -> None:
        for hidden, kwargs in inputs:
            self._forward_one(layer, hidden, kwargs)

    @staticmethod
    def _forward_one(layer: nn.Module, hidden: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        out = layer(hidden, **kwargs)
        return out[0] if isinstance(out, tuple) else out


def quantize_layer_by_layer(source: FloatCheckpoint, names: list[str], windows: torch.Tensor,
                            quantize_linear: QuantizeLinear) -> dict[str, Any]:
    """Quantize the linear weights ``names`` of ``source`` layer by layer with their input Hessians
    on ``windows``: each layer's inputs come from the already-quantized layers before it. Returns
    ``{name: format tensors}``; ``ValueError`` if the model's modules do not cover ``names``."""
    targets = {name.removesuffix(".weight") for name in names}
    results: dict[str, Any] = {}

    def visit(prefix: str, layer: nn.Module, feed: Callable[[], None]) -> None:
        linears = {f"{prefix}.{n}": m for n, m in layer.named_modules() if f"{prefix}.{n}" in targets}
        hessians = _collect_hessians(linears, feed)
        for name, module in linears.items():
            tensors, dequantized = quantize_linear(f"{name}.weight", module.weight, hessians[name].matrix)
            module.weight.copy_(dequantized.to(module.weight.dtype))
            results[f"{name}.weight"] = tensors

    LayerwiseRunner(source.path, windows).run(visit)
    missing = sorted(set(names) - set(results))
    if missing:
        raise ValueError(f"the layer-by-layer pass did not reach {len(missing)} linear weights, e.g. {missing[0]}; "
                         "use round-to-nearest (--method rtn) for this model")
    return results


def _collect_hessians(linears: dict[str, nn.Module], feed: Callable[[], None]) -> dict[str, HessianAccumulator]:
    """Run ``feed`` with hooks accumulating each linear's input Hessian; linears fed the same tensor
    (q/k/v, gate/up) share one ``X^T X`` per batch. The last input is held, so its identity is unique."""
    hessians = {name: HessianAccumulator(module.in_features) for name, module in linears.items()}
    last: dict[str, Any] = {"input": None}

    def hook(accumulator: HessianAccumulator, inputs: torch.Tensor) -> None:
        if last["input"] is not inputs:
            flat = inputs.detach().reshape(-1, inputs.shape[-1]).to(torch.float32)
            last.update(input=inputs, product=flat.T @ flat, rows=flat.shape[0])
        accumulator.add_product(last["product"], last["rows"])

    handles = [module.register_forward_hook(lambda _m, args, _out, h=hessians[name]: hook(h, args[0]))
               for name, module in linears.items()]
    try:
        feed()
    finally:
        for handle in handles:
            handle.remove()
    return hessians


def _decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The first ``...layers`` ModuleList of the model (``model.layers`` for the llama family)."""
    for name, module in model.named_modules():
        if name.rpartition(".")[2] == "layers" and isinstance(module, nn.ModuleList) and len(module):
            return name, module
    raise ValueError(f"{type(model).__name__} has no decoder layer list ('layers') to calibrate layer by layer")
