"""Model implementations, the transformers fallback, checkpoint-name mapping, and the lazy registry.

Native: Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, Mixtral, Qwen2/3-MoE, BERT and decoder embedding
backbones; any other transformers decoder runs through the fallback. The registry resolves a
Hugging Face architecture name to a class, importing it only when used.
"""
