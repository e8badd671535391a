"""The plugin contract of tokenmill: everything a platform, attention or quantization plugin needs.

This package imports nothing else from tokenmill, so a plugin that depends only on it stays a true
peer of the first-party plugins. Changing a signature here bumps ``PLUGIN_API_VERSION``: a new
optional member bumps the minor number, anything that breaks an existing plugin bumps the major.

Documented submodules, imported by the plugins that need them (each imports no more of tokenmill):

* ``tokenmill.plugin_api.graphs``: ``DecodeGraph`` and ``GraphCaptureDeclined`` (also exported here);
* ``tokenmill.plugin_api.linear``: ``Linear``, the layer quantizers' weights and kernels live in, and its loading rules;
* ``tokenmill.plugin_api.model``: the model contract (``Model``, ``BuildContext``, ...; also exported here);
* ``tokenmill.plugin_api.native``: C kernels built per machine and called so decode graphs can record them;
* ``tokenmill.plugin_api.reference_attention``: ``ReferenceAttentionBackend``, the plain-PyTorch oracle
  (registered by core as ``reference``), and its plan (``AttentionGroup``, ``ReferenceAttentionMetadata``);
* ``tokenmill.plugin_api.quantize_tools``: what a quantizer's ``quantize_checkpoint`` is written with;
* ``tokenmill.plugin_api.safetensors_checkpoint``: a checkpoint's safetensors files, read tensor by tensor.
"""

from tokenmill.plugin_api.attention import (
    AttentionBackend,
    AttentionBatch,
    AttentionCapabilities,
    AttentionSpec,
)
from tokenmill.plugin_api.communicator import Communicator
from tokenmill.plugin_api.graphs import DecodeGraph, GraphCaptureDeclined
from tokenmill.plugin_api.hookspecs import PROJECT_NAME, hookimpl, hookspec
from tokenmill.plugin_api.layer_kernels import LayerKernels
from tokenmill.plugin_api.model import BuildContext, EncoderModel, Model, StepContext
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
from tokenmill.plugin_api.version import PLUGIN_API_VERSION, api_version_problem, declared_api_version, is_compatible

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
    "BuildContext",
    "Communicator",
    "DecodeGraph",
    "DeviceInfo",
    "EncoderModel",
    "Fp8Format",
    "GraphCaptureDeclined",
    "LayerKernels",
    "LinearSpec",
    "MemoryInfo",
    "Model",
    "Platform",
    "PlatformCapabilities",
    "ProbeResult",
    "QuantKernel",
    "Quantizer",
    "StepContext",
    "TorchDistributedCommunicator",
    "api_version_problem",
    "declared_api_version",
    "hookimpl",
    "hookspec",
    "is_compatible",
]
