"""Plain-PyTorch reference implementations registered through core's own entry points: a CPU
platform, paged attention and unquantized linear layers. They are the correctness oracle for every
kernel and the path of last resort."""
