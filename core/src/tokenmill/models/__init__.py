"""Model implementations (Llama, Mistral, Qwen2, Qwen3), the checkpoint-name mapping they share,
and the registry that resolves a Hugging Face architecture name to a class lazily."""
