"""load_tokenizer: a Hugging Face tokenizer from a model folder, a GGUF file, or a hub name.

A GGUF file carries its tokenizer; the quantization format that reads the file builds it
(``Quantizer.tokenizer``), so core needs no GGUF code of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# files that mean "this folder carries its own tokenizer", so a GGUF beside them is not needed
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class TokenizerLoadError(ValueError):
    """The tokenizer of a model could not be found or loaded."""


def load_tokenizer(
    model: str | Path,
    *,
    gguf_file: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> Any:
    """Load the tokenizer of ``model``.

    ``model`` is a folder (with tokenizer files, or holding exactly one ``.gguf``), a ``.gguf``
    file, or a hub name. GGUF files carry their tokenizer, which the quantizer that recognises the
    file builds (``checkpoint_file_tokenizer``).
    """
    from transformers import AutoTokenizer

    path = Path(model)
    location: str | Path = model
    if path.is_file() and path.suffix == ".gguf":
        location, gguf_file = path.parent, path.name
    elif path.is_dir() and gguf_file is None and not any((path / f).exists() for f in _TOKENIZER_FILES):
        candidates = sorted(p.name for p in path.glob("*.gguf"))
        if len(candidates) > 1:
            raise TokenizerLoadError(f"{path} holds several GGUF files ({', '.join(candidates)}); name one of them.")
        if not candidates:
            raise TokenizerLoadError(f"{path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}) and no GGUF file.")
        gguf_file = candidates[0]
    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    try:
        if gguf_file is not None:
            return checkpoint_file_tokenizer(Path(location) / gguf_file)
        return AutoTokenizer.from_pretrained(str(location), **kwargs)
    except (OSError, ValueError, KeyError) as error:
        where = f"{location} (GGUF file {gguf_file})" if gguf_file else str(location)
        raise TokenizerLoadError(f"Could not load the tokenizer of {where}: {error}") from error


def checkpoint_file_tokenizer(path: Path) -> Any:
    """The tokenizer a checkpoint file carries, from the most confident installed quantizer that
    recognises the file and builds one (``Quantizer.tokenizer``); ``ValueError`` when none does."""
    from tokenmill.discovery import discover
    from tokenmill.discovery.model_description import recognising_quantizers

    ranked, notes = recognising_quantizers(discover(), str(path))
    for _, record in ranked:
        tokenizer = record.obj.from_config({}, str(path)).tokenizer(str(path))
        if tokenizer is not None:
            return tokenizer
    if ranked:
        raise ValueError(f"the quantization formats that recognise it ({', '.join(r.name for _, r in ranked)}) "
                         f"supply no tokenizer")
    raise ValueError("; ".join(notes) or "no installed quantization format recognises the file")
