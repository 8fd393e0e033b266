"""STAND-IN for vllm/v1/core/kv_cache_manager.py: blocks per request from a free list (no prefix
caching); KVCacheBlocks.get_block_ids() gives one list per KV cache group, as vLLM's does."""
import math


class KVCacheBlocks:
    def __init__(self, ids):
        self._ids = list(ids)

    def get_block_ids(self):
        return (list(self._ids),)

    def get_unhashed_block_ids(self):
        return list(self._ids)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks))
        self.num_blocks = num_blocks
        self.req_blocks: dict = {}

    def allocate_slots(self, request, num_new_tokens: int):
        have = self.req_blocks.setdefault(request.request_id, [])
        need = math.ceil((request.num_computed_tokens + num_new_tokens) / self.block_size) - len(have)
        if need > len(self.free_blocks):
            return None
        for _ in range(max(0, need)):
            have.append(self.free_blocks.pop(0))
        return KVCacheBlocks(have)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.req_blocks.get(request_id, []))

    def get_block_ids(self, request_id: str):
        return (list(self.req_blocks.get(request_id, [])),)

    def free(self, request) -> None:
        self.free_blocks.extend(self.req_blocks.pop(request.request_id, []))
