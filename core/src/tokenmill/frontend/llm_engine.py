"""LLMEngine: the synchronous engine for one process — front end plus an in-process EngineCore."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from tokenmill.config import EngineArgs, EngineConfig
from tokenmill.engine_core.config_resolver import resolve_config
from tokenmill.engine_core.core_builder import build_engine_core
from tokenmill.engine_core.engine_core import EngineCore
from tokenmill.frontend.input_processor import InputProcessor, PromptType
from tokenmill.frontend.output_processor import OutputProcessor
from tokenmill.outputs import RequestOutput
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler.stats import SchedulerStats
from tokenmill.tokenizer.loader import load_tokenizer
from tokenmill.wire import EngineCoreRequest

logger = logging.getLogger("tokenmill")


def load_model_tokenizer(config: EngineConfig) -> Any:
    """The tokenizer the checkpoint's format supplies (GGUF metadata), else the one at tokenizer_path."""
    quantizer = config.selection.quantizer_instance
    tokenizer = quantizer.tokenizer(config.model.tokenizer_path) if quantizer is not None else None
    return tokenizer if tokenizer is not None else load_tokenizer(config.model.tokenizer_path)


class LLMEngine:
    """add_request / step / abort_request over an EngineCore in the same process."""

    def __init__(self, config: EngineConfig, core: EngineCore, tokenizer: Any) -> None:
        self.config = config
        self.core = core
        self.tokenizer = tokenizer
        self.inputs = InputProcessor(tokenizer, config.model, config.max_logprobs)
        self.outputs = OutputProcessor()
        self.last_stats: SchedulerStats | None = None  # the scheduler's after the last step

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        config = resolve_config(args)
        logger.info("engine configuration:\n%s", config.render_report())
        tokenizer = load_model_tokenizer(config)
        return cls(config, build_engine_core(config), tokenizer)

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (vLLM's behaviour)."""
        return SamplingParams(**self.config.model.generation_defaults)

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams, *, priority: int = 0,
                    cache_salt: str | None = None, arrival_time: float | None = None,
                    prompt_text: str | None = None) -> None:
        """Tokenize, validate and queue a request (its n > 1 children share one RequestOutput)."""
        text, token_ids = self.inputs.tokenize(prompt)
        params = self.inputs.validate(token_ids, params)
        request = EngineCoreRequest(request_id, token_ids, params, eos_token_ids=list(self.inputs.eos_token_ids),
                                    arrival_time=arrival_time or time.time(), priority=priority, cache_salt=cache_salt)
        engine_requests = self.outputs.add_request(request, prompt_text or text, self.tokenizer)
        try:
            for engine_request in engine_requests:
                self.core.add_request(engine_request)
        except ValueError:
            self.abort_request([request_id])
            raise

    def abort_request(self, request_ids: Iterable[str]) -> None:
        self.core.abort_requests(self.outputs.abort(list(request_ids)))

    def has_unfinished_requests(self) -> bool:
        return self.outputs.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """One engine iteration; returns the RequestOutputs that changed."""
        core_outputs = self.core.step()
        self.last_stats = core_outputs.scheduler_stats
        request_outputs, stopped = self.outputs.process(core_outputs.outputs, core_outputs.timestamp)
        if stopped:
            self.core.finish_requests(stopped, stop_reason=None)
        return request_outputs

    def shutdown(self) -> None:
        self.core.shutdown()
