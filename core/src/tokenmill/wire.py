"""The wire between the front end and the engine core: the messages, their msgpack codecs, and the
framing of the two ZMQ sockets between the processes.

Every message is a msgspec struct, so it crosses a socket as msgpack, never pickle; in-process
(``LLMEngine``) the structs are passed as they are. On the sockets a message is one multipart
frame ``[kind, payload]`` (``frame`` / ``decode``):

- front end -> engine: ADD (a list of EngineCoreRequest: the n samples of one prompt travel
  together, so one step admits them all), EMBED (EngineCoreEmbedRequest), ABORT / FINISH (a list
  of request ids), SHUTDOWN (no payload);
- engine -> front end: READY (EngineCoreReady, once the model is loaded), OUTPUTS
  (EngineCoreOutputs, one per step that changed something), EMBEDDINGS (EngineCoreEmbeddings),
  REJECTED (EngineCoreFailure for a request the core refused), DEAD (EngineCoreFailure, then the
  engine process exits).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler.stats import SchedulerStats

ADD, EMBED, ABORT, FINISH, SHUTDOWN = b"add", b"embed", b"abort", b"finish", b"shutdown"
READY, OUTPUTS, EMBEDDINGS, REJECTED, DEAD = b"ready", b"outputs", b"embeddings", b"rejected", b"dead"
CANNOT_GENERATE = "this model is an embedding model; it cannot generate (use /v1/embeddings)"


class LogprobsEntry(msgspec.Struct, array_like=True, omit_defaults=True):
    """Log-probabilities at one position: the chosen token first, then the top-k, best first.

    ``ranks[i]`` is the 1-based rank of ``token_ids[i]`` in the full distribution.
    """

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]


class EngineCoreRequest(msgspec.Struct, omit_defaults=True):
    """A tokenized request for the engine core."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: list[int] = []
    arrival_time: float = 0.0
    priority: int = 0
    cache_salt: str | None = None
    fork_of: str | None = None  # a sibling (n > 1) whose full prompt blocks this request may share


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one step produced for one request: new tokens and, at the end, why it finished.

    ``finish_reason`` is "stop", "length" or "abort"; ``stop_reason`` is the stop token id when a
    stop token (not EOS) ended it. ``num_cached_tokens`` is the prompt's prefix-cache hit length.
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[LogprobsEntry] | None = None
    prompt_logprobs: list[LogprobsEntry | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True):
    """One step's outputs, with the scheduler's gauges and counters after it (for logging and metrics)."""

    outputs: list[EngineCoreOutput]
    timestamp: float = 0.0
    scheduler_stats: SchedulerStats | None = None


class EngineCoreReady(msgspec.Struct):
    """What the front end needs to know about the loaded engine (the model's limits, defaults, report)."""

    served_model_name: str
    model_path: str
    tokenizer_path: str
    architecture: str
    dtype: str
    quantization: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    generation_defaults: dict[str, Any]
    chat_template: str | None
    max_logprobs: int
    max_num_seqs: int
    max_num_batched_tokens: int
    scheduling_policy: str
    num_kv_blocks: int
    block_size: int
    platform: str
    device: str
    report: str
    can_generate: bool = True  # False for encoder-only (embedding) models
    embedding_size: int = 0  # the length of the model's embeddings (its hidden size)


class EngineCoreEmbedRequest(msgspec.Struct, array_like=True):
    """Whole prompts to embed, as token ids the front end has checked (non-empty, in vocabulary,
    at most max_model_len long)."""

    request_id: str
    prompts: list[list[int]]


class EngineCoreEmbeddings(msgspec.Struct, array_like=True):
    """The pooled embeddings of one EngineCoreEmbedRequest: float32 little-endian, row-major
    [num_rows, dim] in prompt order."""

    request_id: str
    num_rows: int
    dim: int
    data: bytes

    @classmethod
    def from_array(cls, request_id: str, vectors: np.ndarray) -> EngineCoreEmbeddings:
        rows = np.ascontiguousarray(vectors, dtype="<f4")
        return cls(request_id, rows.shape[0], rows.shape[1], rows.tobytes())

    def vectors(self) -> np.ndarray:
        """The embeddings as a float32 array [num_rows, dim]."""
        return np.frombuffer(self.data, dtype="<f4").reshape(self.num_rows, self.dim)


class EngineCoreFailure(msgspec.Struct):
    """A request the core refused (``request_id`` set), or why the engine stopped (``request_id`` None)."""

    message: str
    request_id: str | None = None


_encoder = msgspec.msgpack.Encoder()
_ids = msgspec.msgpack.Decoder(list[str])
_failure = msgspec.msgpack.Decoder(EngineCoreFailure)
_DECODERS = {
    ADD: msgspec.msgpack.Decoder(list[EngineCoreRequest]), EMBED: msgspec.msgpack.Decoder(EngineCoreEmbedRequest),
    ABORT: _ids, FINISH: _ids, READY: msgspec.msgpack.Decoder(EngineCoreReady),
    OUTPUTS: msgspec.msgpack.Decoder(EngineCoreOutputs), EMBEDDINGS: msgspec.msgpack.Decoder(EngineCoreEmbeddings),
    REJECTED: _failure, DEAD: _failure,
}


def frame(kind: bytes, message: Any = None) -> list[bytes]:
    """The multipart frame ``[kind, msgpack payload]`` of one message (SHUTDOWN has no payload)."""
    return [kind, b"" if message is None else _encoder.encode(message)]


def decode(kind: bytes, payload: bytes) -> Any:
    """The message of a received frame, typed by its kind; None for SHUTDOWN. Raises KeyError for
    a kind this wire does not define, msgspec.DecodeError for a malformed payload."""
    if kind == SHUTDOWN:
        return None
    return _DECODERS[kind].decode(payload)
