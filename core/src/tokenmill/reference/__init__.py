"""Plain-PyTorch reference implementations registered through core's own entry points: a CPU
platform and unquantized linear layers (the reference paged attention, which plugins build on, is
``tokenmill.plugin_api.reference_attention``). They are the correctness oracle for every kernel and
the path of last resort."""
