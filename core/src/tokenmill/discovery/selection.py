"""The whole selection chain: platform -> compute dtype -> attention backend per layer type ->
quantization format -> kernel per linear layer shape, recorded in one ``SelectionReport``.

Each step is also usable on its own (``select_platform``, ``select_attention_backend``,
``select_quantizer``, ``select_kernel``); this module only strings them together the way the
engine and ``tokenmill plugins explain`` do.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill.discovery.attention_choice import select_attention_backend
from tokenmill.discovery.kernel_choice import KernelTarget, select_kernel
from tokenmill.discovery.model_description import ModelDescription
from tokenmill.discovery.platform_choice import select_platform
from tokenmill.discovery.quantizer_choice import select_quantizer
from tokenmill.discovery.record import BROKEN
from tokenmill.discovery.registry import PluginRegistry
from tokenmill.discovery.report import SelectionReport
from tokenmill.discovery.selection_error import SelectionError
from tokenmill.plugin_api import PlatformCapabilities

AUTO = "auto"


@dataclass(frozen=True)
class SelectionRequest:
    """The user's say in selection (CLI flags / engine arguments); ``None``/"auto" = choose."""

    device: str | None = None
    allow_cpu_fallback: bool = False
    allow_attention_fallback: bool = False
    attention_backend: str | None = None
    quantization: str | None = None
    dtype: str = AUTO
    dtype_source: str | None = None  # who set ``dtype`` when not the user: "platform cpu", "plugin NAME"
    kv_cache_dtype: str = AUTO
    block_size: int = 16


def resolve_dtype(requested: str, checkpoint_dtype: str | None, caps: PlatformCapabilities,
                  source: str | None = None) -> tuple[str, str]:
    """(compute dtype, why): a set dtype wins (the user's ``--dtype``, or the default of ``source``, a
    platform or plugin, for a user who left it "auto"); "auto" keeps the checkpoint's dtype when the
    platform computes it, else takes the platform's first (default) dtype."""
    if requested and requested != AUTO:
        name = requested.removeprefix("torch.")
        given = f"dtype {requested} (default from {source})" if source else f"--dtype {requested}"
        if name not in caps.dtypes:
            raise SelectionError(f"{given}: the platform computes {', '.join(caps.dtypes)}")
        return name, f"default from {source}" if source else "requested with --dtype"
    if checkpoint_dtype in caps.dtypes:
        return checkpoint_dtype, "the checkpoint's dtype"
    if checkpoint_dtype:
        return caps.dtypes[0], f"platform default; the checkpoint's {checkpoint_dtype} is not computed here"
    return caps.dtypes[0], "platform default; the checkpoint names no dtype"


def select(registry: PluginRegistry, request: SelectionRequest, model: ModelDescription | None = None,
           activate: bool = True) -> SelectionReport:
    """Run the chain for ``model`` (or only the platform step without one). ``activate`` calls the
    chosen platform's ``activate()`` before its capabilities are read, as the engine does.
    Raises SelectionError, whose message names every candidate and reason."""
    platform_choice = select_platform(registry, request.device, request.allow_cpu_fallback)
    report = SelectionReport(platform_choice, warnings=list(platform_choice.warnings))
    if model is None:
        return report
    platform = platform_choice.instantiate()
    if activate:
        platform.activate()
    report.platform_instance = platform
    report.notes += model.notes

    report.dtype, report.dtype_reason = resolve_dtype(request.dtype, model.checkpoint_dtype, platform.capabilities,
                                                      request.dtype_source)
    specs = model.attention_specs(report.dtype, request.kv_cache_dtype, request.block_size)
    for layer_type, spec in specs.items():
        choice = select_attention_backend(registry, platform, spec, request.attention_backend,
                                          request.allow_attention_fallback)
        report.attention[layer_type] = choice
        report.warnings += [w for w in choice.warnings if w not in report.warnings]

    quantizer_choice = select_quantizer(registry, model.hf_config, model.model_path, request.quantization)
    report.quantizer = quantizer_choice
    report.notes += quantizer_choice.notes
    try:
        quantizer = quantizer_choice.quantizer_cls.from_config(model.hf_config, model.model_path)
    except ValueError as error:
        raise SelectionError(f"quantization '{quantizer_choice.name}': {error}") from None
    report.quantizer_instance = quantizer
    target = KernelTarget.of(platform)
    report.kernels = [select_kernel(quantizer, spec, target) for spec in model.linear_specs(report.dtype)]
    report.warnings += _broken_plugin_warnings(registry)
    return report


def _broken_plugin_warnings(registry: PluginRegistry) -> list[str]:
    """Broken attention backends, quantizers and general plugins are not fatal, but never silent."""
    warnings = []
    for kind in ("attention_backend", "quantizer", "plugin"):
        for record in registry.records(kind):
            if record.status in BROKEN:
                warnings.append(f"{kind.replace('_', ' ')} plugin '{record.name}' ({record.source}) is "
                                f"{record.status.value}: {record.reason}")
    return warnings
