"""tokenmill platform plugin for Apple silicon GPUs through PyTorch's MPS (Metal) backend.

Importing this package is cheap: torch is imported inside methods, never at module level.
"""
