"""SequenceState: one completion of a request in the front end — its tokens, incremental text,
stop-string search and logprobs — as engine-core outputs arrive."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenmill.outputs import CompletionOutput, Logprob, SampleLogprobs
from tokenmill.sampling_params import RequestOutputKind, SamplingParams
from tokenmill.tokenizer.detokenizer import IncrementalDetokenizer, token_texts
from tokenmill.tokenizer.stop_strings import find_stop_string, stop_holdback
from tokenmill.wire import EngineCoreOutput, LogprobsEntry


def logprob_dicts(entries: Sequence[LogprobsEntry | None], tokenizer: Any | None) -> list[dict[int, Logprob] | None]:
    """Logprobs entries as per-position ``{token id: Logprob}`` dicts with the tokens' texts (None stays None)."""
    ids = [t for e in entries if e is not None for t in e.token_ids]
    texts = iter(token_texts(tokenizer, ids) if tokenizer is not None else [None] * len(ids))
    result: list[dict[int, Logprob] | None] = []
    for entry in entries:
        if entry is None:
            result.append(None)
            continue
        position: dict[int, Logprob] = {}
        for token_id, logprob, rank in zip(entry.token_ids, entry.logprobs, entry.ranks, strict=True):
            text = next(texts)
            position.setdefault(token_id, Logprob(logprob, rank, text))  # the sampled token keeps its own rank
        result.append(position)
    return result


class SequenceState:
    """Text, tokens and logprobs of one engine request (one completion)."""

    def __init__(
        self,
        index: int,
        params: SamplingParams,
        prompt_token_ids: list[int],
        tokenizer: Any | None,
        keep_logprobs: bool,
    ) -> None:
        self.index = index
        self.params = params
        self.tokenizer = tokenizer
        self.detokenizer = None
        if tokenizer is not None and params.detokenize:
            self.detokenizer = IncrementalDetokenizer(
                tokenizer,
                prompt_token_ids,
                skip_special_tokens=params.skip_special_tokens,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
            )
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: SampleLogprobs | None = [] if keep_logprobs else None
        self.cumulative_logprob: float | None = None if params.logprobs is None else 0.0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self._holdback = stop_holdback(params.stop, params.include_stop_str_in_output)
        self._searched_chars = 0  # text before this offset holds no stop string (or is within min_tokens)
        self._sent_chars = self._sent_tokens = self._sent_logprobs = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def update(self, output: EngineCoreOutput) -> str | None:
        """Apply one step's output; return the stop string that ended the sequence, if one did."""
        new_ids = list(output.new_token_ids)
        if output.new_logprobs:
            self.cumulative_logprob = (self.cumulative_logprob or 0.0) + sum(e.logprobs[0] for e in output.new_logprobs)
            if self.logprobs is not None:
                self.logprobs += logprob_dicts(output.new_logprobs, self.tokenizer)
        self.token_ids += new_ids
        stop_string = self._detokenize(new_ids, output) if self.detokenizer is not None else None
        if stop_string is not None:
            self.finish_reason, self.stop_reason = "stop", stop_string
        elif output.finished:
            self.finish_reason, self.stop_reason = output.finish_reason, output.stop_reason
        return stop_string

    def _detokenize(self, new_ids: list[int], output: EngineCoreOutput) -> str | None:
        params = self.params
        text_ids = new_ids
        token_stopped = output.finish_reason == "stop" and not isinstance(output.stop_reason, str)
        if token_stopped and new_ids and not params.include_stop_str_in_output:
            text_ids = new_ids[:-1]  # the EOS / stop token's own text stays out, like vLLM
        num_before = len(self.token_ids) - len(new_ids)
        for offset, token_id in enumerate(text_ids):
            self.text += self.detokenizer.push(token_id)
            if num_before + offset + 1 <= params.min_tokens:
                self._searched_chars = len(self.text)
        if output.finished:
            self.text += self.detokenizer.flush()
        if not params.stop or len(self.token_ids) <= params.min_tokens:
            return None
        match = find_stop_string(
            self.text, len(self.text) - self._searched_chars, params.stop, params.include_stop_str_in_output
        )
        self._searched_chars = len(self.text)
        if match is None:
            return None
        stop_string, cut = match
        self.text = self.text[:cut]
        return stop_string

    def completion(self, kind: RequestOutputKind) -> CompletionOutput:
        """This sequence as a CompletionOutput: all of it, or (DELTA) what was not sent yet.
        While unfinished, the last characters that could start a stop string are held back."""
        visible = len(self.text) if self.finished else max(len(self.text) - self._holdback, self._sent_chars)
        if kind == RequestOutputKind.DELTA:
            text = self.text[self._sent_chars : visible]
            token_ids = self.token_ids[self._sent_tokens :]
            logprobs = None if self.logprobs is None else self.logprobs[self._sent_logprobs :]
            self._sent_chars, self._sent_tokens = visible, len(self.token_ids)
            self._sent_logprobs = 0 if self.logprobs is None else len(self.logprobs)
        else:
            text, token_ids = self.text[:visible], list(self.token_ids)
            logprobs = None if self.logprobs is None else list(self.logprobs)
        return CompletionOutput(
            index=self.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=self.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
