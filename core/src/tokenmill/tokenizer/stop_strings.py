"""Stop strings: find the first one in newly decoded text, across token boundaries."""

from __future__ import annotations

from collections.abc import Sequence


def find_stop_string(
    text: str, num_new_chars: int, stop: Sequence[str], include_stop_str_in_output: bool
) -> tuple[str, int] | None:
    """The earliest stop string that ends inside the last ``num_new_chars`` characters of ``text``.

    Only the new text plus ``len(stop_string) - 1`` characters before it are searched, since older
    text was searched before. Returns the stop string and the length to cut ``text`` to: its start,
    or its end when ``include_stop_str_in_output``. Ties at one position go to the earlier entry.
    """
    if num_new_chars <= 0 or not stop:
        return None
    best: tuple[int, str] | None = None
    for stop_str in stop:
        start = max(len(text) - num_new_chars - len(stop_str) + 1, 0)
        index = text.find(stop_str, start)
        if index != -1 and (best is None or index < best[0]):
            best = (index, stop_str)
    if best is None:
        return None
    index, stop_str = best
    return stop_str, index + len(stop_str) if include_stop_str_in_output else index


def stop_holdback(stop: Sequence[str], include_stop_str_in_output: bool) -> int:
    """How many trailing characters a stream must hold back: they may begin a stop string that
    would be cut from the output once complete."""
    if not stop or include_stop_str_in_output:
        return 0
    return max(len(s) for s in stop) - 1
