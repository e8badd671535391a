"""The version of the plugin contract, separate from tokenmill's own release version."""

# 1.1: optional Quantizer.quantize_checkpoint, Platform.create_graph, AttentionCapabilities.graph_capture
# 1.2: optional Quantizer.quantizes_tied_lm_head, Platform.layer_kernels (LayerKernels)
PLUGIN_API_VERSION: tuple[int, int] = (1, 2)


def is_compatible(plugin_version: tuple[int, int], core_version: tuple[int, int] = PLUGIN_API_VERSION) -> bool:
    """A plugin built for API ``(major, minor)`` loads when the major numbers agree and the
    plugin does not need a newer minor than core provides."""
    return plugin_version[0] == core_version[0] and plugin_version[1] <= core_version[1]
