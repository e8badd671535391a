"""tokenmill's INT8 format plugin: per-channel int8 weights, weight-only or with int8 activations."""
