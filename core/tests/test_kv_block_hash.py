"""Prefix hashing: canonical SHA-256 encoding, chaining, salt separation, only full blocks."""

import hashlib
import struct

import pytest

from tokenmill.kv_cache.block_hash import ROOT_PARENT_HASH, extend_block_hashes, hash_block_tokens


def test_encoding_is_canonical_sha256():
    expected = hashlib.sha256(
        b"tokenmill-kv-block-v1" + ROOT_PARENT_HASH + struct.pack("<I3q", 3, 1, 2, 3) + struct.pack("<I", 0)
    ).digest()
    assert hash_block_tokens(None, [1, 2, 3]) == expected
    assert len(expected) == 32


def test_hash_depends_on_parent_tokens_and_extra_keys():
    base = hash_block_tokens(None, [1, 2, 3, 4])
    assert hash_block_tokens(None, (1, 2, 3, 4)) == base
    assert hash_block_tokens(base, [1, 2, 3, 4]) != base
    assert hash_block_tokens(None, [1, 2, 3, 5]) != base
    assert hash_block_tokens(None, [1, 2, 3, 4], ("salt", "a")) != base
    assert hash_block_tokens(None, [1, 2, 3, 4], ("salt", "a")) != hash_block_tokens(None, [1, 2, 3, 4], ("salt", "b"))


def test_extra_keys_are_type_tagged():
    def digest(keys):
        return hash_block_tokens(None, [1], keys)

    variants = [(1,), ("1",), (b"1",), (True,), (None,), ((1,),), (), ("ab", "c"), ("a", "bc")]
    assert len({digest(v) for v in variants}) == len(variants)
    with pytest.raises(TypeError, match="unsupported extra key"):
        digest((1.5,))


def test_token_boundaries_are_unambiguous():
    assert hash_block_tokens(None, [1, 23]) != hash_block_tokens(None, [12, 3])
    assert hash_block_tokens(None, [256]) != hash_block_tokens(None, [0, 1])


def test_chained_hashes_identify_the_whole_prefix():
    a, b = [], []
    extend_block_hashes(a, [1, 2, 3, 4, 5, 6, 7, 8], 4, 2, None)
    extend_block_hashes(b, [9, 9, 9, 9, 5, 6, 7, 8], 4, 2, None)
    assert len(a) == len(b) == 2
    assert a[1] != b[1]  # same second block, different first block
    assert a[1] == hash_block_tokens(a[0], [5, 6, 7, 8])


def test_salt_separates_every_block():
    tokens = list(range(12))
    unsalted, salt_a, salt_a2, salt_b = [], [], [], []
    extend_block_hashes(unsalted, tokens, 4, 3, None)
    extend_block_hashes(salt_a, tokens, 4, 3, "a")
    extend_block_hashes(salt_a2, tokens, 4, 3, "a")
    extend_block_hashes(salt_b, tokens, 4, 3, "b")
    assert salt_a == salt_a2
    for i in range(3):
        assert len({unsalted[i], salt_a[i], salt_b[i]}) == 3


def test_extend_is_incremental_and_hashes_only_full_blocks():
    tokens = list(range(10))
    once, stepwise = [], []
    extend_block_hashes(once, tokens, 4, 2, None)
    extend_block_hashes(stepwise, tokens, 4, 1, None)
    extend_block_hashes(stepwise, tokens, 4, 2, None)
    assert once == stepwise
    with pytest.raises(AssertionError, match="only full blocks"):
        extend_block_hashes(once, tokens, 4, 3, None)
