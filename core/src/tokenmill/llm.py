"""LLM: the offline API — generate and chat over a batch of prompts, with a progress bar, and embed."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tokenmill.config import EngineArgs
from tokenmill.frontend.input_processor import PromptType
from tokenmill.frontend.llm_engine import LLMEngine
from tokenmill.frontend.offline_embedding import EmbeddingRequestOutput
from tokenmill.outputs import RequestOutput
from tokenmill.sampling_params import SamplingParams

Conversation = Sequence[Mapping[str, Any]]


class LLM:
    """Load a model once, then ``generate`` or ``chat`` over many prompts with continuous batching.

    Keyword arguments are EngineArgs fields (``dtype``, ``max_model_len``, ``max_num_seqs``,
    ``max_num_batched_tokens``, ``block_size``, ``kv_cache_memory``, ``enable_prefix_caching``,
    ``enable_chunked_prefill``, ``device``, ``seed``, ...).
    """

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.engine = LLMEngine.from_engine_args(EngineArgs.from_kwargs(model=model, **kwargs))
        self._counter = itertools.count()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLM:
        """An LLM from already-built EngineArgs (as the CLI makes them)."""
        from dataclasses import asdict

        values = asdict(engine_args)
        return cls(values.pop("model"), **values)

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        return self.engine.default_sampling_params()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (blocks that running requests hold stay theirs), so the next
        prompts are computed in full, e.g. between timed runs of the same prompts."""
        self.engine.core.scheduler.reset_prefix_cache()
        return True

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Complete every prompt (text, token ids, or {"prompt_token_ids": ...}); outputs in prompt order."""
        prompt_list = self._as_prompt_list(prompts)
        return self._run([(p, None) for p in prompt_list], sampling_params, use_tqdm, priority)

    def embed(self, prompts: PromptType | Sequence[PromptType], *, pooling: str | None = None,
              normalize: bool | None = None) -> list[EmbeddingRequestOutput]:
        """One pooled embedding per prompt (``outputs.embedding``: a list of floats), in prompt order.

        Pooling comes from the model directory's sentence-transformers files when present, else
        the model kind's default (encoders: CLS token, decoders: last token; normalised);
        ``pooling`` ("mean", "cls", "last") and ``normalize`` override it.
        """
        from tokenmill.engine_core.embedding import model_pooling
        from tokenmill.frontend.offline_embedding import EmbeddingOutput, embed_in_process, tokenize_for_embedding

        token_ids = [tokenize_for_embedding(self.engine, p) for p in self._as_prompt_list(prompts)]
        chosen = model_pooling(self.engine.core.runner.model, self.engine.config.model.path, pooling, normalize)
        vectors = embed_in_process(self.engine, token_ids, chosen)
        return [EmbeddingRequestOutput(str(next(self._counter)), ids, EmbeddingOutput(vector.tolist()))
                for ids, vector in zip(token_ids, vectors, strict=True)]

    def chat(self, messages: Conversation | Sequence[Conversation],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict[str, Any] | None = None) -> list[RequestOutput]:
        """Answer one conversation or a list of them using the model's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        prompts = []
        for conversation in conversations:
            text, ids = self.engine.inputs.chat(conversation, chat_template=chat_template,
                                                add_generation_prompt=add_generation_prompt,
                                                **(chat_template_kwargs or {}))
            prompts.append(({"prompt_token_ids": ids}, text))
        return self._run(prompts, sampling_params, use_tqdm, None)

    @staticmethod
    def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
        if isinstance(prompts, (str, Mapping)):
            return [prompts]
        prompts = list(prompts)
        if prompts and isinstance(prompts[0], int):
            return [prompts]
        return prompts

    def _run(self, prompts: list[tuple[PromptType, str | None]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None, use_tqdm: bool,
             priority: Sequence[int] | None) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params_list = ([sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams)
                       else list(sampling_params))
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} sampling params")
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(priority)} priorities")
        order: dict[str, int] = {}
        try:
            for index, ((prompt, text), params) in enumerate(zip(prompts, params_list, strict=True)):
                request_id = str(next(self._counter))
                order[request_id] = index
                self.engine.add_request(request_id, prompt, params, priority=priority[index] if priority else 0,
                                        prompt_text=text)
            return self._drain(order, use_tqdm)
        except BaseException:
            self.engine.abort_request(list(order))
            raise

    def _drain(self, order: dict[str, int], use_tqdm: bool) -> list[RequestOutput]:
        results: list[RequestOutput | None] = [None] * len(order)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(order), desc="Processed prompts", dynamic_ncols=True,
                       postfix="output: 0 tok/s")
        started = time.perf_counter()
        output_tokens = 0
        finished = 0
        while finished < len(order):
            for output in self.engine.step():
                if output.request_id not in order or not output.finished:
                    continue
                results[order[output.request_id]] = output
                finished += 1
                output_tokens += sum(len(c.token_ids) for c in output.outputs)
                if bar is not None:
                    rate = output_tokens / max(time.perf_counter() - started, 1e-9)
                    bar.set_postfix_str(f"output: {rate:.1f} tok/s", refresh=False)
                    bar.update(1)
        if bar is not None:
            bar.close()
        return results  # type: ignore[return-value]
