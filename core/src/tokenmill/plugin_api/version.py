"""The version of the plugin contract, separate from tokenmill's own release version."""

# 1.1: optional Quantizer.quantize_checkpoint, Platform.create_graph, AttentionCapabilities.graph_capture
# 1.2: optional Quantizer.quantizes_tied_lm_head, Platform.layer_kernels (LayerKernels)
# 1.3: optional LayerKernels.gather_rows, PlatformCapabilities.graph_max_batch, native_call recording
#      (tokenmill.layers.native_calls) for CPU decode graphs
# 1.4: optional LayerKernels.small_batch_linear (decode-step matrix products), asked by core's oneDNN linear
# 1.5: optional AttentionCapabilities.prefill_graph_capture, PlatformCapabilities.prefill_graph_max_tokens
#      (single-request prefill chunks replayed through graphs, one per padded length)
# 1.6: optional LayerKernels.argmax_rows and LayerKernels.greedy_lm_head (greedy steps' argmax),
#      QuantKernel.plain_weight
# 1.7: optional LayerKernels.small_batch_linear_covers (core's oneDNN linear then keeps no reordered copy)
# 2.0: removed LayerKernels.small_batch_linear and LayerKernels.small_batch_linear_covers (the CPU's decode
#      products now belong to its own linear kernel); new optional Platform.linear_kernels (a platform's
#      kernels for plain float weights, standing in for a format's plain-weight kernels),
#      Platform.allocate_kv_cache and Platform.back_kv_cache (KV cache memory and backing its pages)
PLUGIN_API_VERSION: tuple[int, int] = (1, 7)


def is_compatible(plugin_version: tuple[int, int], core_version: tuple[int, int] = PLUGIN_API_VERSION) -> bool:
    """A plugin built for API ``(major, minor)`` loads when the major numbers agree and the
    plugin does not need a newer minor than core provides."""
    return plugin_version[0] == core_version[0] and plugin_version[1] <= core_version[1]
