"""C kernels of the CPU platform, compiled on first use with the system C compiler (no torch headers)."""
