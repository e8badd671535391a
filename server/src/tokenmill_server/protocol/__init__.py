"""Pydantic request models of the HTTP APIs (OpenAI completions and chat, Anthropic messages, tokenize)."""
