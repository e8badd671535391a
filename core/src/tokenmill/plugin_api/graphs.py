"""The decode-graph contract: what ``Platform.create_graph`` returns and how a capture declines.

Core's graph runners pad decode-only steps (and single-request prefill chunks) to a bucket size and
run each bucket through one ``DecodeGraph``: ``capture`` once, then ``replay`` every step. The
forward reads static input buffers whose contents change between replays, never their addresses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class GraphCaptureDeclined(RuntimeError):
    """A graph's ``capture`` refusing a forward it cannot record faithfully (for example one that
    runs operations its platform's graph does not replay). Steps then run eagerly; logged as
    information, not as a failure."""


class DecodeGraph(Protocol):
    """One batch size's graph: ``capture`` once, then ``replay`` every step.

    ``plan()`` plans attention for the static buffers as they hold the step now; ``forward(meta)``
    runs the model on the static buffers with that plan and returns the hidden states.
    ``freezes_plan`` is True when replays reuse the plan made at capture (a recorded graph).
    """

    freezes_plan: bool

    def capture(self, plan: Callable[[], Any], forward: Callable[[Any], Any]) -> None:
        """Record (or, eagerly, remember) ``forward``; runs it at least once. Raises
        ``GraphCaptureDeclined`` when the forward cannot be recorded faithfully."""
        ...

    def replay(self) -> Any:
        """Run the recorded forward on the buffers' current contents; returns the hidden states
        as a tensor [bucket, hidden]."""
        ...
