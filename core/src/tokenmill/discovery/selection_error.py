"""SelectionError: selection could not decide, and says why (every candidate with its reasons)."""


class SelectionError(RuntimeError):
    """Raised when no platform, attention backend, quantizer or kernel can be chosen, or when the
    choice would be ambiguous or would hide a broken plugin. The message is meant for the user and
    lists every candidate with its reasons (and tracebacks of plugins that raised)."""
