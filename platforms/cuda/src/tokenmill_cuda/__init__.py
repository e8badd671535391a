"""tokenmill platform plugin for NVIDIA GPUs (the CUDA build of PyTorch).

Importing this package is cheap: torch is imported inside methods, never at module level.
"""
