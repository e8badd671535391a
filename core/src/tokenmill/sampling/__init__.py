"""Sampling: from a step's logits to next tokens and logprobs (see Sampler)."""

from tokenmill.sampling.batch import SamplingBatch
from tokenmill.sampling.logprobs import logprobs_entries, prompt_logprobs_for_chunk
from tokenmill.sampling.penalties import Penalties
from tokenmill.sampling.sampler import Sampler, SamplerOutput

__all__ = ["Penalties", "Sampler", "SamplerOutput", "SamplingBatch", "logprobs_entries", "prompt_logprobs_for_chunk"]
