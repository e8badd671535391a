"""The plugin contract of tokenmill: everything a platform, attention or quantization plugin needs.

This package imports nothing else from tokenmill, so a plugin that depends only on it stays a true
peer of the first-party plugins. Changing a signature here bumps ``PLUGIN_API_VERSION``: a new
optional member bumps the minor number, anything that breaks an existing plugin bumps the major.
"""

from tokenmill.plugin_api.attention import (
    AttentionBackend,
    AttentionBatch,
    AttentionCapabilities,
    AttentionSpec,
)
from tokenmill.plugin_api.communicator import Communicator
from tokenmill.plugin_api.hookspecs import PROJECT_NAME, hookimpl, hookspec
from tokenmill.plugin_api.layer_kernels import LayerKernels
from tokenmill.plugin_api.platform import (
    DeviceInfo,
    Fp8Format,
    MemoryInfo,
    Platform,
    PlatformCapabilities,
    ProbeResult,
)
from tokenmill.plugin_api.quantization import LinearSpec, Quantizer, QuantKernel
from tokenmill.plugin_api.torch_communicator import TorchDistributedCommunicator
from tokenmill.plugin_api.version import PLUGIN_API_VERSION, is_compatible

ENTRY_POINT_GROUPS = {
    "platform": "tokenmill.platforms",
    "attention_backend": "tokenmill.attention_backends",
    "quantizer": "tokenmill.quantizers",
    "plugin": "tokenmill.plugins",
}

__all__ = [
    "ENTRY_POINT_GROUPS",
    "PLUGIN_API_VERSION",
    "PROJECT_NAME",
    "AttentionBackend",
    "AttentionBatch",
    "AttentionCapabilities",
    "AttentionSpec",
    "Communicator",
    "DeviceInfo",
    "Fp8Format",
    "LayerKernels",
    "LinearSpec",
    "MemoryInfo",
    "Platform",
    "PlatformCapabilities",
    "ProbeResult",
    "QuantKernel",
    "Quantizer",
    "TorchDistributedCommunicator",
    "hookimpl",
    "hookspec",
    "is_compatible",
]
