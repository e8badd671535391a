"""tokenmill platform plugin for Intel GPUs through upstream ``torch.xpu``.

Importing this package is cheap: torch is imported inside methods, never at module level, and
Intel Extension for PyTorch is never imported unless it matches the running torch (see ``ipex``).
"""
