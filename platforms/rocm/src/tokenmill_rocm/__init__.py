"""tokenmill platform plugin for AMD GPUs (the ROCm build of PyTorch).

Importing this package is cheap: torch is imported inside methods, never at module level.
"""
