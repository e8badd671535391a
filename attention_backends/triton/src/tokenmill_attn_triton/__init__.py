"""tokenmill-attn-triton: a Triton paged-attention backend (entry point name "triton")."""

from tokenmill_attn_triton.backend import TritonAttentionBackend

__all__ = ["TritonAttentionBackend"]
