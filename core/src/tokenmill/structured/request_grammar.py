"""RequestGrammar: one request's position in its grammar, as the token mask for its next token."""

from __future__ import annotations

from typing import Any


class RequestGrammar:
    """An xgrammar matcher: which tokens may come next, advanced by every token the request keeps.

    Once the grammar is complete only the request's stop tokens are allowed; accepting one (or
    completing a grammar that admits nothing more) terminates it."""

    def __init__(self, compiled: Any, stop_token_ids: list[int]) -> None:
        import xgrammar

        self._matcher = xgrammar.GrammarMatcher(compiled, override_stop_tokens=stop_token_ids or None)

    def fill_mask(self, bitmask: Any, row: int) -> None:
        """Write the allowed next tokens into row ``row`` of an xgrammar token bitmask."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False when the grammar does not allow it (the matcher is unchanged)."""
        return self._matcher.accept_token(token_id)

    @property
    def is_terminated(self) -> bool:
        """Whether the output is complete: a stop token was accepted, or nothing more can follow."""
        return self._matcher.is_terminated()
