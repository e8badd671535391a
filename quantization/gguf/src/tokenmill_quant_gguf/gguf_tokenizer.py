"""load_gguf_tokenizer: the tokenizer a GGUF file carries, converted once per file and then cached.

transformers rebuilds a GGUF's tokenizer from its metadata (every token and merge through the
``gguf`` reader), which takes seconds on every start. The converted
tokenizer is saved with ``save_pretrained`` under ``$TOKENMILL_CACHE/tokenizers`` (default
``~/.cache/tokenmill/tokenizers``), keyed by the file's path, size and modification time and by the
transformers version, and later starts load that folder. The cache keeps the
``KEEP`` most recently stored files. A cache that cannot be written or read is skipped with a debug
log: the tokenizer is then converted as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
KEEP = 16


def tokenizer_cache_dir() -> Path:
    """``$TOKENMILL_CACHE/tokenizers`` (default ``~/.cache/tokenmill/tokenizers``)."""
    base = os.environ.get("TOKENMILL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tokenmill")
    return Path(base) / "tokenizers"


def cache_key(gguf_path: str | Path) -> str:
    """Changes whenever the file (path, size, modification time) or transformers' version does."""
    import transformers

    path = Path(gguf_path).resolve()
    stat = path.stat()
    identity = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{transformers.__version__}"
    return f"{path.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def load_gguf_tokenizer(gguf_path: str | Path, **kwargs: Any) -> Any:
    """The Hugging Face tokenizer (with its chat template) stored in ``gguf_path``; ``kwargs`` go to
    ``AutoTokenizer.from_pretrained``."""
    from transformers import AutoTokenizer

    path = Path(gguf_path)
    try:
        cached = tokenizer_cache_dir() / cache_key(path)
        if cached.is_dir():
            return AutoTokenizer.from_pretrained(str(cached), **kwargs)
    except (OSError, ValueError) as error:
        logger.debug("converted tokenizer cache not used for %s: %s", path, error)
        cached = None
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs)
    if cached is not None:
        _store(tokenizer, cached)
    return tokenizer


def _store(tokenizer: Any, target: Path) -> None:
    """Save into a fresh folder beside ``target`` and rename it into place (atomic: a concurrent
    start either sees the whole folder or none)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
        tokenizer.save_pretrained(str(staging))
        try:
            staging.rename(target)
        except OSError:  # another process stored it first
            shutil.rmtree(staging, ignore_errors=True)
        stored = sorted((entry for entry in target.parent.iterdir() if entry.is_dir() and not entry.name.startswith(".")),
                        key=lambda entry: entry.stat().st_mtime_ns, reverse=True)
        for stale in stored[KEEP:]:
            shutil.rmtree(stale, ignore_errors=True)
    except OSError as error:
        logger.debug("could not cache the converted tokenizer in %s: %s", target, error)
