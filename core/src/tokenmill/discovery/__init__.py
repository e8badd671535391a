"""Plugin discovery and selection: which plugins are installed, which of them can run here, and
which platform, attention backend, quantization format and kernels a model gets (and why).

Typical use::

    registry = discover()                       # lazy: nothing is imported yet
    report = select(registry, SelectionRequest(device="cuda"), ModelDescription.load(registry, path))
    print(report.render())
"""

from tokenmill.discovery.attention_choice import AttentionChoice, select_attention_backend
from tokenmill.discovery.kernel_choice import KernelChoice, KernelTarget, select_kernel
from tokenmill.discovery.model_description import ModelDescription
from tokenmill.discovery.platform_choice import DEVICE_ENV_VAR, PlatformChoice, select_platform
from tokenmill.discovery.plugin_manager import (
    Contribution,
    PluginConflictError,
    build_plugin_manager,
    collect_config_overrides,
    collect_models,
)
from tokenmill.discovery.policy import PluginPolicy
from tokenmill.discovery.quantizer_choice import QuantCandidate, QuantizerChoice, select_quantizer
from tokenmill.discovery.record import KINDS, PluginRecord, PluginStatus
from tokenmill.discovery.registry import PluginRegistry, discover
from tokenmill.discovery.rejection import Rejection
from tokenmill.discovery.report import SelectionReport
from tokenmill.discovery.selection import SelectionRequest, resolve_dtype, select
from tokenmill.discovery.selection_error import SelectionError

__all__ = [
    "DEVICE_ENV_VAR",
    "KINDS",
    "AttentionChoice",
    "Contribution",
    "KernelChoice",
    "KernelTarget",
    "ModelDescription",
    "PlatformChoice",
    "PluginConflictError",
    "PluginPolicy",
    "PluginRecord",
    "PluginRegistry",
    "PluginStatus",
    "QuantCandidate",
    "QuantizerChoice",
    "Rejection",
    "SelectionError",
    "SelectionReport",
    "SelectionRequest",
    "build_plugin_manager",
    "collect_config_overrides",
    "collect_models",
    "discover",
    "resolve_dtype",
    "select",
    "select_attention_backend",
    "select_kernel",
    "select_platform",
    "select_quantizer",
]
