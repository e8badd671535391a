"""OpenAI /v1/embeddings inputs and response bodies, without torch (the server's front end uses them).

``embedding_prompts`` turns OpenAI's ``input`` (a string, strings, a token array, token arrays)
into checked token ids; ``embedding_response`` shapes float32 rows as the response body, each
embedding a list of floats or base64 of little-endian float32.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenmill.frontend.input_processor import PromptTooLongError


def encode_embedding(vector: Sequence[float] | np.ndarray, encoding_format: str) -> list[float] | str:
    """OpenAI's encodings: "float" (a list) or "base64" (little-endian float32 bytes)."""
    if encoding_format == "float":
        return np.asarray(vector, dtype=np.float32).tolist()
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    raise ValueError(f"encoding_format must be 'float' or 'base64', not {encoding_format!r}")


def embedding_inputs(inputs: str | Sequence[Any], max_inputs: int | None = None) -> list[str | list[int]]:
    """OpenAI's ``input`` as a list of prompts: a string, a list of strings, a token array, or a list
    of token arrays; none of them empty, at most ``max_inputs`` of them."""
    if isinstance(inputs, str):
        inputs = [inputs]
    inputs = list(inputs)
    if not inputs:
        raise ValueError("input must not be empty")
    if all(isinstance(x, int) for x in inputs):
        inputs = [inputs]
    if not all(isinstance(x, str) or (isinstance(x, list) and all(isinstance(t, int) for t in x)) for x in inputs):
        raise ValueError("input must be a string, a list of strings, a list of token ids, or a list of such lists")
    if max_inputs is not None and len(inputs) > max_inputs:
        raise ValueError(f"input holds {len(inputs)} items, more than the maximum of {max_inputs} per request")
    empty = next((i for i, x in enumerate(inputs) if not x), None)
    if empty is not None:
        raise ValueError(f"input[{empty}] is empty" if len(inputs) > 1 else "input must not be empty")
    return inputs


def embedding_response(vectors: Any, prompt_tokens: int, encoding_format: str, model_name: str) -> dict[str, Any]:
    """OpenAI's /v1/embeddings body: ``{"object": "list", "data": [{"object": "embedding", "index",
    "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}`` for rows of ``vectors``."""
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encode_embedding(v, encoding_format)}
                 for i, v in enumerate(vectors)],
        "model": model_name,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def embedding_prompts(input_processor: Any, model: Any, inputs: str | Sequence[Any],
                      max_inputs: int | None = None) -> list[list[int]]:
    """Token ids of every prompt of an OpenAI ``input`` (``embedding_inputs``), each checked like
    ``checked_embedding_ids``; errors name the offending item when there are several."""
    prompts = embedding_inputs(inputs, max_inputs)
    return [checked_embedding_ids(input_processor, model, prompt, f"input[{i}]: " if len(prompts) > 1 else "")
            for i, prompt in enumerate(prompts)]


def checked_embedding_ids(input_processor: Any, model: Any, prompt: Any, where: str = "") -> list[int]:
    """Token ids of one prompt (``input_processor.tokenize``), non-empty, in the vocabulary and at
    most ``model.max_model_len`` long (an embedding may use the whole context: nothing is generated
    after it). ``where`` prefixes the error messages."""
    _, ids = input_processor.tokenize(prompt)
    if not ids:
        raise ValueError(f"{where}cannot embed an empty prompt")
    limit, vocab = model.max_model_len, model.vocab_size
    if len(ids) > limit:
        raise PromptTooLongError(f"{where}the prompt is {len(ids)} tokens long, but this model embeds at most "
                                 f"{limit} tokens")
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ValueError(f"{where}token id {bad} is out of vocabulary (the vocabulary has {vocab} tokens)")
    return ids
