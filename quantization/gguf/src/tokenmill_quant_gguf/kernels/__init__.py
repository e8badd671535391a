"""C sources of the GGUF plugin's CPU kernels (compiled on first use by ``cpu_kernel``)."""
