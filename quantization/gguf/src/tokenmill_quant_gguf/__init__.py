"""tokenmill's GGUF format plugin: read llama.cpp checkpoints and run their linear layers."""

from tokenmill_quant_gguf.quantizer import GGUFQuantizer

__all__ = ["GGUFQuantizer"]
