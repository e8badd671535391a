"""``POST /v1/completions`` request: a prompt as text, token ids, or a batch of either."""

from __future__ import annotations

from pydantic import Field

from tokenmill_server.protocol.common import INT64_MAX, SamplingFields, TokenId

Prompt = str | list[str] | list[TokenId] | list[list[TokenId]]


class CompletionRequest(SamplingFields):
    """OpenAI's legacy completions, with vLLM's extra sampling parameters."""

    prompt: Prompt = Field(..., description="Text, token ids, or a list of either (one completion set per prompt).")
    max_tokens: int | None = Field(16, ge=0, le=INT64_MAX, description="0 is allowed only with echo (score the prompt).")
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=INT64_MAX)
    best_of: int | None = Field(None, ge=1, le=INT64_MAX)
    suffix: str | None = Field(None, description="Not supported: must be absent.")
    add_special_tokens: bool = True
    response_format: dict | None = Field(None, description="{'type': 'text' | 'json_object' | 'json_schema'}, the "
                                         "latter with {'json_schema': {'schema': ...}}.")

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the batch, text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        return list(prompt)
