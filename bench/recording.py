# SPDX-License-Identifier: Apache-2.0
"""An offloading spec whose manager keeps stored keys in an unbounded set and
records every store; the connector loads it through ``spec_module_path``.
No worker: the benchmark reports every transfer job complete right away."""

from collections.abc import Collection

from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingSpec,
    OffloadKey,
    PrepareStoreOutput,
    RequestOffloadingContext,
    get_offload_group_idx,
)


class KeysSpec(LoadStoreSpec):
    def __init__(self, keys: Collection[OffloadKey]):
        self.keys = list(keys)


class RecordingManager(OffloadingManager):
    def __init__(self):
        self.stored: set[OffloadKey] = set()
        # Chunks newly stored per KV cache group; reset between passes.
        self.stored_per_group: dict[int, int] = {}

    def lookup(self, key, req_context):
        return LookupResult.HIT if key in self.stored else LookupResult.MISS

    def prepare_load(self, keys, req_context):
        return KeysSpec(keys)

    def prepare_store(self, keys, req_context):
        new = [key for key in keys if key not in self.stored]
        self.stored.update(new)
        for key in new:
            group = get_offload_group_idx(key)
            self.stored_per_group[group] = self.stored_per_group.get(group, 0) + 1
        return PrepareStoreOutput(
            keys_to_store=new, store_spec=KeysSpec(new), evicted_keys=[]
        )

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def get_stats(self):
        return None


class RecordingSpec(OffloadingSpec):
    def __init__(self, config):
        super().__init__(config)
        self.manager = RecordingManager()

    def get_manager(self):
        return self.manager

    def get_worker(self, kv_caches):
        raise NotImplementedError("the benchmark runs the scheduler side only")
