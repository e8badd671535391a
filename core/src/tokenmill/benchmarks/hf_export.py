"""export_hf_dir: a GGUF converted once by transformers into an fp32 safetensors folder (for peers
such as vLLM that read Hugging Face folders), cached beside the benchmark results."""

from __future__ import annotations

import json
import os
from pathlib import Path


def export_hf_dir(gguf_path: str, cache_dir: str = ".cache/bench") -> str:
    """The folder (created on first use) holding ``gguf_path``'s weights in fp32 with its tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = Path(gguf_path)
    target = Path(cache_dir) / f"{source.stem}-fp32-{source.stat().st_size}"
    if (target / "config.json").exists():
        return str(target)
    tmp = target.with_name(target.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name).save_pretrained(tmp)
    os.replace(tmp, target)
    return str(target)
