# SPDX-License-Identifier: Apache-2.0
"""Unit tests of the host-copy offloading spec (no engine): real block copies
between engine KV tensors and the host buffer, checked byte by byte."""

import numpy as np
import pytest
import torch
from vllm.utils.math_utils import cdiv
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from e2e.host_offload import (
    CORRUPT_LOADS_KEY,
    HostCopyOffloadingSpec,
    HostCopyOffloadingWorker,
    group_copy_indices,
)

NUM_ENGINE_BLOCKS = 24
NUM_HOST_CHUNKS = 12
PAGES = (256, 96)  # engine page bytes of the two KV tensors


def make_kv_caches(seed: int = 0) -> CanonicalKVCaches:
    """Two KV tensors shared by two groups, like a hybrid model's layers:
    group 0 uses both tensors with full pages, group 1 uses tensor 0 with an
    un-padded page smaller than the tensor's (a padded Mamba-style page)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = [
        CanonicalKVCacheTensor(
            torch.randint(
                -128, 127, (NUM_ENGINE_BLOCKS, page), dtype=torch.int8, generator=gen
            ),
            page,
        )
        for page in PAGES
    ]
    refs = [
        [CanonicalKVCacheRef(0, PAGES[0]), CanonicalKVCacheRef(1, PAGES[1])],
        [CanonicalKVCacheRef(0, 200)],
    ]
    return CanonicalKVCaches(tensors, refs)


def host_ids_for(group_sizes, block_indices, bpc, start=0) -> list[int]:
    """Distinct, shuffled host chunk ids, as many as each group needs."""
    n = sum(cdiv(s + i % bpc, bpc) for s, i in zip(group_sizes, block_indices) if s)
    ids = list(range(start, start + n))
    np.random.default_rng(len(ids) + bpc).shuffle(ids)
    return ids


def engine_page(caches: CanonicalKVCaches, t: int, block: int) -> torch.Tensor:
    return caches.tensors[t].tensor[block].clone()


CASES = [
    # blocks_per_chunk, group_sizes, block_indices (first logical block)
    (1, (3, 2), (0, 5)),
    (2, (4, 3), (0, 0)),
    (2, (3, 1), (1, 3)),  # unaligned first blocks: start mid-chunk
    (3, (5, 2), (2, 4)),
    (3, (0, 4), (0, 7)),  # an empty group
]


@pytest.mark.parametrize("bpc,group_sizes,block_indices", CASES)
def test_store_then_load_round_trips_every_byte(bpc, group_sizes, block_indices):
    caches = make_kv_caches()
    worker = HostCopyOffloadingWorker(caches, bpc, NUM_HOST_CHUNKS)
    src_blocks = [1, 7, 3, 9, 11, 2, 4][: sum(group_sizes)]
    originals = {
        (t, b): engine_page(caches, t, b) for t in range(len(PAGES)) for b in src_blocks
    }
    host_ids = host_ids_for(group_sizes, block_indices, bpc)
    store_src = GPULoadStoreSpec(src_blocks, group_sizes, block_indices)
    assert worker.submit_store(1, store_src, CPULoadStoreSpec(host_ids))

    # Scribble over the engine, then load into other blocks.
    for kv in caches.tensors:
        kv.tensor.fill_(5)
    dst_blocks = [20, 13, 17, 15, 21, 12, 19][: sum(group_sizes)]
    load_dst = GPULoadStoreSpec(dst_blocks, group_sizes, block_indices)
    assert worker.submit_load(2, CPULoadStoreSpec(host_ids), load_dst)

    expected_bytes = 0
    k = 0
    for refs, size in zip(caches.group_data_refs, group_sizes):
        for src, dst in zip(src_blocks[k : k + size], dst_blocks[k : k + size]):
            for ref in refs:
                got = caches.tensors[ref.tensor_idx].tensor[dst]
                want = originals[(ref.tensor_idx, src)]
                n = ref.page_size_bytes
                assert torch.equal(got[:n], want[:n]), (src, dst, ref)
        expected_bytes += size * sum(ref.page_size_bytes for ref in refs)
        k += size
    # A group whose pages are padded leaves the padding alone on load.
    if group_sizes[0] == 0:
        dst = dst_blocks[0]
        assert torch.all(caches.tensors[0].tensor[dst][200:] == 5)

    results = {r.job_id: r for r in worker.get_finished()}
    assert set(results) == {1, 2}
    assert all(r.success for r in results.values())
    assert results[1].transfer_size == results[2].transfer_size == expected_bytes
    assert worker.get_finished() == []  # reported once


@pytest.mark.parametrize("bpc,group_sizes,block_indices", CASES)
def test_host_layout_matches_vllm_cpu_worker_pointers(bpc, group_sizes, block_indices):
    """Where a stored block lands must be where vLLM's own CPU worker puts it:
    compute_sub_block_ptrs (used by its GPU->CPU handler) gives the host byte
    address of each sub-block; the bytes there must be the engine block's."""
    caches = make_kv_caches(seed=1)
    worker = HostCopyOffloadingWorker(caches, bpc, NUM_HOST_CHUNKS)
    src_blocks = np.array([2, 8, 5, 14, 6, 10, 3][: sum(group_sizes)], dtype=np.int64)
    host_ids = np.array(host_ids_for(group_sizes, block_indices, bpc), dtype=np.int64)
    worker.submit_store(
        7,
        GPULoadStoreSpec(src_blocks.tolist(), group_sizes, block_indices),
        CPULoadStoreSpec(host_ids.tolist()),
    )
    host_flat = [h.view(h.shape[0], -1) for h in worker.host]
    k = h_off = 0
    checked = 0
    for refs, size, first in zip(caches.group_data_refs, group_sizes, block_indices):
        if not size:
            continue
        skip = first % bpc
        n_host = cdiv(size + skip, bpc)
        group_host = host_ids[h_off : h_off + n_host]
        for ref in refs:
            host = host_flat[ref.tensor_idx]
            ptrs = np.empty(size, dtype=np.uint64)
            compute_sub_block_ptrs(group_host, bpc, ptrs, host, skip_count=skip)
            base = host.data_ptr()
            for j, ptr in enumerate(ptrs):
                off = int(ptr) - base
                row, col = divmod(off, host.shape[1])
                got = host[row, col : col + ref.page_size_bytes]
                want = caches.tensors[ref.tensor_idx].tensor[src_blocks[k + j]]
                assert torch.equal(got, want[: ref.page_size_bytes])
                checked += 1
        k += size
        h_off += n_host
    assert checked == sum(
        s * len(r) for s, r in zip(group_sizes, caches.group_data_refs)
    )


def test_group_copy_indices_chunk_to_block():
    # blocks_per_chunk 3, first logical block 4 (skip 1): 5 blocks span chunks
    # [a: slots 1, 2][b: slots 0, 1, 2].
    chunks, slots = group_copy_indices(5, 4, np.array([40, 41]), 3)
    assert chunks.tolist() == [40, 40, 41, 41, 41]
    assert slots.tolist() == [1, 2, 0, 1, 2]
    with pytest.raises(AssertionError):
        group_copy_indices(5, 4, np.array([40, 41, 42]), 3)  # one chunk too many


def test_host_id_count_mismatch_is_refused():
    caches = make_kv_caches()
    worker = HostCopyOffloadingWorker(caches, 2, NUM_HOST_CHUNKS)
    with pytest.raises(AssertionError):
        worker.submit_store(
            1, GPULoadStoreSpec([1, 2, 3], (3, 0), (0, 0)), CPULoadStoreSpec([0, 1, 2])
        )


def test_corrupting_worker_writes_zeros_on_load():
    caches = make_kv_caches()
    worker = HostCopyOffloadingWorker(caches, 1, NUM_HOST_CHUNKS, corrupt_loads=True)
    worker.submit_store(
        1, GPULoadStoreSpec([3, 4], (1, 1), (0, 0)), CPULoadStoreSpec([0, 1])
    )
    assert worker.host[0][0].abs().sum() > 0
    worker.submit_load(
        2, CPULoadStoreSpec([0, 1]), GPULoadStoreSpec([9, 10], (1, 1), (0, 0))
    )
    assert torch.all(caches.tensors[0].tensor[9] == 0)
    assert torch.all(caches.tensors[1].tensor[9] == 0)
    assert torch.all(caches.tensors[0].tensor[10][:200] == 0)


def offloading_config(extra: dict) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(
            OffloadingGroupConfig(tokens_per_block=32, layer_names=("a0", "a1")),
            OffloadingGroupConfig(tokens_per_block=32, layer_names=("b0",)),
        ),
        worker_kv_bytes_per_block=sum(PAGES),
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id="test",
        model=OffloadingModelConfig(name="tiny", dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=32, blocks_per_chunk=2),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def test_spec_keeps_vllm_manager_and_runs_on_the_cpu_platform():
    from vllm.platforms import current_platform

    assert current_platform.is_cpu()
    extra = {
        "spec_name": "HostCopyOffloadingSpec",
        "spec_module_path": HostCopyOffloadingSpec.__module__,
        "cpu_bytes_to_use": 1 << 20,
    }
    assert OffloadingSpecFactory.get_spec_cls(extra) is HostCopyOffloadingSpec
    spec = HostCopyOffloadingSpec(offloading_config(extra))
    # Same host block count as the stock spec: bytes / aligned chunk bytes.
    stock = CPUOffloadingSpec(offloading_config(extra))
    assert spec.num_blocks == stock.num_blocks > 0
    assert isinstance(spec.get_manager(), CPUOffloadingManager)
    worker = spec.get_worker(make_kv_caches())
    assert isinstance(worker, HostCopyOffloadingWorker)
    assert spec.get_worker(make_kv_caches()) is worker
    assert worker.host[0].shape == (spec.num_blocks, 2, PAGES[0])
    assert not worker.corrupt_loads
    # The stock spec refuses this platform: the reason this spec exists.
    with pytest.raises(Exception, match="only supported on CUDA"):
        stock.get_worker(make_kv_caches())
    corrupt = HostCopyOffloadingSpec(
        offloading_config({**extra, CORRUPT_LOADS_KEY: True})
    )
    assert corrupt.get_worker(make_kv_caches()).corrupt_loads
