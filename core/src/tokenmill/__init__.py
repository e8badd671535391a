"""tokenmill: a hardware-neutral LLM inference engine with a plugin-based hardware abstraction layer."""

__version__ = "0.1.0"
