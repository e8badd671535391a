"""Structured outputs: JSON schema, regex, choice and EBNF grammar constraints on generated tokens (xgrammar)."""

from tokenmill.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
