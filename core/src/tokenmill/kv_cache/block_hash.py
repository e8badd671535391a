"""Prefix hashing: chained SHA-256 content hashes of full KV-cache blocks.

A block's hash covers its parent block's hash, its token ids and its extra keys, so equal hashes mean
equal token prefixes (up to a SHA-256 collision). The encoding is canonical: type-tagged,
length-prefixed, little-endian, independent of the Python process (no ``hash()``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes

ROOT_PARENT_HASH: BlockHash = bytes(32)  # stands in for the parent of a sequence's first block
_DOMAIN = b"tokenmill-kv-block-v1"


def hash_block_tokens(parent_hash: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """Hash one block: ``sha256(domain, parent, tokens, extra keys)``; None parent means first block."""
    h = hashlib.sha256(_DOMAIN)
    h.update(ROOT_PARENT_HASH if parent_hash is None else parent_hash)
    h.update(struct.pack(f"<I{len(token_ids)}q", len(token_ids), *token_ids))
    h.update(_encode_extra_keys(extra_keys))
    return h.digest()


def block_extra_keys(block_index: int, cache_salt: str | None) -> tuple:
    """The extra keys of block ``block_index``: the salt on the first block (chaining carries it on)."""
    if block_index == 0 and cache_salt is not None:
        return ("salt", cache_salt)
    return ()


def extend_block_hashes(
    block_hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    num_full_blocks: int,
    cache_salt: str | None,
) -> None:
    """Append the hashes of blocks ``len(block_hashes) .. num_full_blocks-1`` of ``token_ids`` in place."""
    assert num_full_blocks * block_size <= len(token_ids), "only full blocks are hashed"
    parent = block_hashes[-1] if block_hashes else None
    for index in range(len(block_hashes), num_full_blocks):
        start = index * block_size
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], block_extra_keys(index, cache_salt))
        block_hashes.append(parent)


def _encode_extra_keys(keys: tuple) -> bytes:
    parts = [struct.pack("<I", len(keys))]
    for key in keys:
        parts.append(_encode_key(key))
    return b"".join(parts)


def _encode_key(key: object) -> bytes:
    if key is None:
        return b"n"
    if isinstance(key, bool):
        return b"t" if key else b"f"
    if isinstance(key, int):
        raw = str(key).encode()  # arbitrary size, still canonical
        return b"i" + struct.pack("<I", len(raw)) + raw
    if isinstance(key, str):
        raw = key.encode("utf-8")
        return b"s" + struct.pack("<I", len(raw)) + raw
    if isinstance(key, bytes):
        return b"b" + struct.pack("<I", len(key)) + key
    if isinstance(key, tuple):
        return b"(" + _encode_extra_keys(key)
    raise TypeError(f"unsupported extra key type {type(key).__name__}: use None, bool, int, str, bytes or tuples")
