# SPDX-License-Identifier: Apache-2.0
"""A host-copy offloading spec for vLLM's CPU platform (test infrastructure).

vLLM 0.29.0's ``CPUOffloadingSpec`` refuses the CPU platform: its worker drives
``swap_blocks_batch`` (not built for CPU) on CUDA streams and events. This spec
keeps the whole scheduler side (``CPUOffloadingSpec.get_manager``: vLLM's
``CPUOffloadingManager``, its host block pool, LRU and store accounting) and
replaces only the worker: blocks are copied with torch indexing between the
engine's KV tensors (host memory on this platform) and a host offload buffer.

Layout (the same as vLLM's CPU worker in the direct, worker-private layout):
for every canonical KV tensor ``t`` with engine page size ``p_t`` the host
buffer is ``(num_host_chunks, blocks_per_chunk * p_t)`` int8; engine block ``k``
of a group's transfer (logical block index ``block_indices[g] + k``) lives in
host chunk ``host_ids[(skip + k) // blocks_per_chunk]`` at sub-slot
``(skip + k) % blocks_per_chunk`` with ``skip = block_indices[g] %
blocks_per_chunk``. Each group's ref copies its un-padded page size
(``ref.page_size_bytes``) per block, and a transfer reports that many bytes, as
the stock worker does.

Load it with (``tests/`` on ``PYTHONPATH``)::

    kv_transfer_config = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "HostCopyOffloadingSpec",
            "spec_module_path": "e2e.host_offload",
            "cpu_bytes_to_use": 1 << 28,
        },
    }

``"host_copy_audit_path"`` keeps a ledger of the manager (e2e.offload_audit).
``"host_copy_corrupt_loads": true`` in the extra config turns the worker into a
negative control: loads write zeros instead of the stored bytes.
"""

import time
from collections.abc import Sequence

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.utils.math_utils import cdiv
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

logger = init_logger(__name__)

CORRUPT_LOADS_KEY = "host_copy_corrupt_loads"


def group_copy_indices(
    group_size: int,
    first_block_index: int,
    host_ids: np.ndarray,
    blocks_per_chunk: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Host (chunk id, sub-slot) of each of a group's ``group_size`` engine
    blocks, the first at logical block index ``first_block_index``."""
    skip = first_block_index % blocks_per_chunk
    assert len(host_ids) == cdiv(group_size + skip, blocks_per_chunk), (
        f"{len(host_ids)} host chunks for {group_size} blocks "
        f"(skip {skip}, {blocks_per_chunk} blocks per chunk)"
    )
    positions = np.arange(group_size, dtype=np.int64) + skip
    return host_ids[positions // blocks_per_chunk], positions % blocks_per_chunk


class HostCopyOffloadingWorker(OffloadingWorker):
    """Synchronous host <-> host block copies; a transfer is finished as soon
    as its submit call returns (stores are already deferred by the connector
    to the start of the next step, after the forward that wrote them)."""

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        num_host_chunks: int,
        corrupt_loads: bool = False,
    ):
        self.blocks_per_chunk = blocks_per_chunk
        self.corrupt_loads = corrupt_loads
        self.group_refs: list[list[CanonicalKVCacheRef]] = kv_caches.group_data_refs
        # Engine views: (num_blocks, page) int8, possibly with a row stride
        # larger than the page (packed layouts).
        self.engine: list[torch.Tensor] = []
        # Host buffers viewed as (num_host_chunks, blocks_per_chunk, page).
        self.host: list[torch.Tensor] = []
        for kv in kv_caches.tensors:
            tensor = kv.tensor
            if tensor.dtype != torch.int8 or tensor.dim() != 2:
                tensor = tensor.view(torch.int8).view(-1, kv.page_size_bytes)
            assert tensor.device.type == "cpu", tensor.device
            assert tensor.shape[1] == kv.page_size_bytes
            self.engine.append(tensor)
            self.host.append(
                torch.zeros(
                    (num_host_chunks, blocks_per_chunk, kv.page_size_bytes),
                    dtype=torch.int8,
                )
            )
        for refs in self.group_refs:
            for ref in refs:
                assert (
                    ref.page_size_bytes
                    <= kv_caches.tensors[ref.tensor_idx].page_size_bytes
                )
        self._finished: list[TransferResult] = []
        logger.info(
            "Host-copy offloading: %d KV tensors, %d host chunks of %d blocks",
            len(self.engine),
            num_host_chunks,
            blocks_per_chunk,
        )

    def _transfer(
        self,
        engine_spec: GPULoadStoreSpec,
        host_spec: BlockIDsLoadStoreSpec,
        store: bool,
    ) -> int:
        engine_ids = engine_spec.block_ids
        host_ids = host_spec.block_ids
        group_sizes: Sequence[int] = engine_spec.group_sizes
        block_indices: Sequence[int] = engine_spec.block_indices
        assert len(group_sizes) == len(self.group_refs)
        num_bytes = 0
        engine_off = 0
        host_off = 0
        for refs, size, first in zip(self.group_refs, group_sizes, block_indices):
            if size == 0:
                continue
            n_host = cdiv(size + first % self.blocks_per_chunk, self.blocks_per_chunk)
            chunk_ids, slots = group_copy_indices(
                size,
                first,
                host_ids[host_off : host_off + n_host],
                self.blocks_per_chunk,
            )
            blocks = torch.from_numpy(engine_ids[engine_off : engine_off + size])
            chunks = torch.from_numpy(chunk_ids)
            subs = torch.from_numpy(slots)
            engine_off += size
            host_off += n_host
            for ref in refs:
                nbytes = ref.page_size_bytes
                engine = self.engine[ref.tensor_idx]
                host = self.host[ref.tensor_idx]
                if store:
                    host[chunks, subs, :nbytes] = engine[blocks, :nbytes]
                elif self.corrupt_loads:
                    engine[blocks, :nbytes] = 0
                else:
                    engine[blocks, :nbytes] = host[chunks, subs, :nbytes]
                num_bytes += size * nbytes
        assert engine_off == len(engine_ids), (engine_off, len(engine_ids))
        assert host_off == len(host_ids), (host_off, len(host_ids))
        return num_bytes

    def _run(self, job_id: int, engine_spec, host_spec, store: bool) -> bool:
        assert isinstance(engine_spec, GPULoadStoreSpec)
        assert isinstance(host_spec, BlockIDsLoadStoreSpec)
        start = time.perf_counter()
        num_bytes = self._transfer(engine_spec, host_spec, store)
        self._finished.append(
            TransferResult(
                job_id=job_id,
                success=True,
                transfer_size=num_bytes,
                transfer_time=time.perf_counter() - start,
            )
        )
        return True

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        return self._run(job_id, src_spec, dst_spec, store=True)

    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec
    ) -> bool:
        return self._run(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return  # every transfer completed inside its submit call

    def shutdown(self) -> None:
        self._finished.clear()
        self.engine.clear()
        self.host.clear()


class HostCopyOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec with the host-copy worker: same manager, same
    host block count (``cpu_bytes_to_use`` / bytes per chunk), on the CPU
    platform (engine KV tensors in host memory)."""

    def _uses_shared_region(self) -> bool:
        return False

    def get_manager(self):
        if self._manager is None:
            from e2e.offload_audit import AUDIT_PATH_KEY, attach_audit

            manager = super().get_manager()
            attach_audit(manager, self.extra_config.get(AUDIT_PATH_KEY))
        return super().get_manager()

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = HostCopyOffloadingWorker(  # type: ignore[assignment]
                kv_caches,
                blocks_per_chunk=self.blocks_per_chunk,
                num_host_chunks=self.num_blocks,
                corrupt_loads=bool(self.extra_config.get(CORRUPT_LOADS_KEY, False)),
            )
        assert self._worker is not None
        return self._worker
