"""Checkpoint loading: safetensors files read lazily (never pickles), model construction from the
registry, and weight loading with missing-tensor and shape checks."""
