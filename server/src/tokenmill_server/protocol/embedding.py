"""``POST /v1/embeddings`` request: OpenAI's fields (``user`` is accepted and ignored)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tokenmill_server.protocol.common import INT64_MAX, ApiModel, TokenId

EmbeddingInput = str | list[str] | list[TokenId] | list[list[TokenId]]


class EmbeddingRequest(ApiModel):
    """OpenAI's embeddings request."""

    model: str | None = Field(None, description="Served model name; omitted means the default model.")
    input: EmbeddingInput = Field(..., description="Text, token ids, or a list of either (one embedding per item).")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: lists of numbers; base64: little-endian float32 bytes, base64-encoded.")
    dimensions: int | None = Field(None, ge=1, le=INT64_MAX,
                                   description="Must equal the model's embedding size (no truncation).")
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        """Each item to embed, text or token ids."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and all(isinstance(item, int) for item in value):
            return [list(value)]
        return list(value)
