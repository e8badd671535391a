"""tokenmill's FP8 format plugin: e4m3 weights with per-tensor, per-channel or block scales."""
