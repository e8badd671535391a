"""The version of the plugin contract (separate from tokenmill's release version) and its check.

Every plugin states the API version it was built against itself: the class an entry point names
sets ``api_version = (major, minor)`` in its own body (a value inherited from another class does
not count: it may be core's own), and a hook module sets a module-level ``api_version``. A plugin
that declares none is refused at discovery and fails the testkit.
"""

import inspect
from typing import Any

# 1.1: optional Quantizer.quantize_checkpoint, Platform.create_graph, AttentionCapabilities.graph_capture
# 1.2: optional Quantizer.quantizes_tied_lm_head, Platform.layer_kernels (LayerKernels)
# 1.3: optional LayerKernels.gather_rows, PlatformCapabilities.graph_max_batch, native_call recording
#      (now plugin_api.native) for CPU decode graphs
# 1.4: optional LayerKernels.small_batch_linear (decode-step matrix products), asked by core's oneDNN linear
# 1.5: optional AttentionCapabilities.prefill_graph_capture, PlatformCapabilities.prefill_graph_max_tokens
#      (single-request prefill chunks replayed through graphs, one per padded length)
# 1.6: optional LayerKernels.argmax_rows and LayerKernels.greedy_lm_head (greedy steps' argmax),
#      QuantKernel.plain_weight
# 1.7: optional LayerKernels.small_batch_linear_covers (core's oneDNN linear then keeps no reordered copy)
# 2.0: the whole contract lives in plugin_api: native calls and the C library builder (plugin_api.native),
#      decode graphs (graphs), the model protocol (model), Linear (linear), quantizer tools (quantize_tools),
#      the reference attention (reference_attention), AttentionBatch.build, shared helpers for plugin families
#      (triton, triton_tiles, compressed_tensors, scale_loaders, gpu_platform, ...);
#      api_version is required and has no default (a plugin without one is refused);
#      Communicator (plugin_api.communicator) with its default TorchDistributedCommunicator, and the
#      optional Platform.create_communicator (a platform may supply a faster transport than torch.distributed);
#      removed LayerKernels.small_batch_linear and LayerKernels.small_batch_linear_covers (the CPU's decode
#      products now belong to its own linear kernel); new optional Platform.linear_kernels (a platform's
#      kernels for plain float weights, standing in for a format's plain-weight kernels),
#      Platform.allocate_kv_cache and Platform.back_kv_cache (KV cache memory and backing its pages);
#      Platform.left_unset (which config fields config_defaults may fill)
PLUGIN_API_VERSION: tuple[int, int] = (2, 0)

API_VERSION_ATTRIBUTE = "api_version"
"""The name under which a plugin class or hook module declares its ``(major, minor)``."""


def is_compatible(plugin_version: tuple[int, int], core_version: tuple[int, int] = PLUGIN_API_VERSION) -> bool:
    """A plugin built for API ``(major, minor)`` loads when the major numbers agree and the
    plugin does not need a newer minor than core provides."""
    return plugin_version[0] == core_version[0] and plugin_version[1] <= core_version[1]


def declared_api_version(plugin: Any) -> Any:
    """What ``plugin`` itself declares as ``api_version``, or None: for a class only its own body
    counts (never a base class's value); for a module or any other object, its attribute."""
    if inspect.isclass(plugin):
        return vars(plugin).get(API_VERSION_ATTRIBUTE)
    return getattr(plugin, API_VERSION_ATTRIBUTE, None)


def is_well_formed(version: Any) -> bool:
    """Whether ``version`` is a ``(major, minor)`` tuple of two non-negative integers."""
    return (isinstance(version, tuple) and len(version) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in version))


def api_version_problem(plugin: Any, core_version: tuple[int, int] = PLUGIN_API_VERSION) -> str | None:
    """None when ``plugin`` declares a well-formed, compatible ``api_version``; otherwise the one line
    that says why it is refused. Discovery and the testkit apply this same rule."""
    version = declared_api_version(plugin)
    core = f"{core_version[0]}.{core_version[1]}"
    if version is None:
        where = "in its class body" if inspect.isclass(plugin) else "at module level"
        return (f"declares no api_version: set api_version = ({core_version[0]}, {core_version[1]}) {where}, "
                f"the plugin API it is built against (this tokenmill provides {core})")
    if not is_well_formed(version):
        return f"declares api_version {version!r}; expected a (major, minor) tuple of integers"
    if not is_compatible(version, core_version):
        return f"declares plugin API {version[0]}.{version[1]}, which this tokenmill ({core}) cannot load"
    return None
