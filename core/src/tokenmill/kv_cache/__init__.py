"""The paged KV cache's bookkeeping (pure Python): blocks, prefix hashing, the pool and the manager."""

from tokenmill.kv_cache.block import KVCacheBlock
from tokenmill.kv_cache.block_hash import BlockHash, hash_block_tokens
from tokenmill.kv_cache.block_pool import NULL_BLOCK_ID, BlockPool
from tokenmill.kv_cache.free_block_queue import FreeBlockQueue
from tokenmill.kv_cache.manager import KVCacheManager
from tokenmill.kv_cache.prefix_cache_stats import PrefixCacheStats

__all__ = [
    "NULL_BLOCK_ID",
    "BlockHash",
    "BlockPool",
    "FreeBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "PrefixCacheStats",
    "hash_block_tokens",
]
