"""Admission: how many tokens a sequence may generate, or why it can never fit.

Pure arithmetic over the context's sizes, asked before a request reaches the engine
thread (``ModelHandle.max_new_tokens``), so a prompt that can never fit is a 400 naming
the config field to raise, not a sequence ended at the first step.
"""

from __future__ import annotations

from dataclasses import dataclass


class ContextLengthExceeded(ValueError):
    """The prompt plus the requested completion can never fit a sequence's context."""


@dataclass(frozen=True)
class ContextLimits:
    n_ctx: int  # KV cells in all
    n_ctx_seq: int  # cells one sequence can use (n_ctx split over sequences, or all of it)
    n_seq_max: int
    max_output_tokens: int | None  # the config's cap on any completion

    def max_new_tokens(self, prompt_len: int, max_tokens: int | None, *,
                       clamp: bool = False) -> int:
        """The completion's length limit for a prompt of ``prompt_len`` tokens; raises
        ContextLengthExceeded. With ``clamp``, a ``max_tokens`` larger than the room the
        prompt leaves is cut to that room (the answer then ends at the context's end with
        finish reason "length"), as the Anthropic API and llama-server let clients ask for
        more than fits."""
        limit, cap = self.n_ctx_seq, self.max_output_tokens
        if max_tokens is not None and not (clamp and prompt_len < limit):
            if prompt_len + max_tokens > limit:
                raise ContextLengthExceeded(
                    f"This model's maximum context length is {limit} tokens. However, you "
                    f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                    f"{max_tokens} for the completion). Please reduce the prompt or max_tokens"
                    f", or raise {self.context_field()}.")
            return min(max_tokens, cap) if cap else max_tokens
        if prompt_len >= limit:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"has {prompt_len} tokens, leaving no room for a completion. Raise "
                f"{self.context_field()}.")
        room = limit - prompt_len
        if max_tokens is not None:
            room = min(room, max_tokens)
        return min(room, cap) if cap else room

    def context_field(self) -> str:
        """The config field that sets the context one sequence gets, for error messages."""
        if self.n_ctx_seq < self.n_ctx:  # split KV: n_ctx is shared out
            return (f"the config's model.n_ctx (now {self.n_ctx}, split over "
                    f"model.n_seq_max = {self.n_seq_max} sequences) or set model.kv_unified")
        return f"the config's model.n_ctx (now {self.n_ctx})"
