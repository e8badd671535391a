"""tokenmill platform plugin for CPUs, tuned by instruction-set detection.

Importing this package is cheap: torch is imported inside methods, never at module level.
"""
