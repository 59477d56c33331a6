# SPDX-License-Identifier: Apache-2.0
"""A store-then-lookup simulation over the real OffloadingConnectorScheduler:
the one harness of the regression tests (tests/regression) and the defect
cases (bench/replay_cases.py).

Request A runs to completion and its chunks are stored into an in-memory set;
then the GPU prefix cache is reset and request B is looked up against that set.
The offloading manager is vLLM's test mock, answering from the set. It runs
on the vLLM tree first on sys.path: the fork (0.29.0 + patches/), or another
base with or without upstream-pr/ (e.g. stock 0.32.0)."""

import functools
import importlib
import inspect
from contextlib import contextmanager, nullcontext
from unittest import mock

import torch

from tests.v1.kv_connector.unit.offloading_connector.utils import (
    MockLoadStoreSpec,
    RequestRunner,
    generate_store_output,
)
from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID
from vllm import SamplingParams
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, get_offload_group_idx
from vllm.v1.request import Request


def _layer(block_size: int) -> dict:
    """One tiny layer: the specs' sizes do not matter to the scheduler."""
    return dict(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)


def full(block_size: int) -> FullAttentionSpec:
    return FullAttentionSpec(**_layer(block_size))


def swa(block_size: int, window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(**_layer(block_size), sliding_window=window)


def chunked_local(block_size: int, chunk: int) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(**_layer(block_size), attention_chunk_size=chunk)


def mamba(block_size: int, cache_mode: str, checkpoints: int = 0) -> MambaSpec:
    """A Mamba layer cached in ``cache_mode`` ("align" or "all"), its state
    16 bytes per token of the block (see _attention_shaped_mamba_pages)."""
    return MambaSpec(
        block_size=block_size,
        shapes=((block_size, 2), (block_size, 2)),
        dtypes=(torch.float32, torch.float32),
        mamba_cache_mode=cache_mode,
        num_prefill_checkpoint_blocks=checkpoints,
    )


def groups(*specs, eagle: tuple[int, ...] = ()) -> list[KVCacheGroupSpec]:
    return [
        KVCacheGroupSpec([f"layer{i}"], spec, is_eagle_group=i in eagle)
        for i, spec in enumerate(specs)
    ]


# Retention setting of the reference that stores every chunk (no mask at all).
EVERY_CHUNK = "every-chunk"
# OffloadSim's default GPU prefix-cache interval: the engine setting's.
AS_ENGINE = "as-engine"
_SCHED = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"


def _no_masks():
    """Switch the store masks off: every complete chunk is stored."""
    sched = importlib.import_module(_SCHED)
    if hasattr(sched, "reachable_chunk_mask"):
        return mock.patch(f"{_SCHED}.reachable_chunk_mask", return_value=None)
    # Stock 0.32.0: the masks come from one scheduler method.
    return mock.patch.object(
        sched.OffloadingConnectorScheduler,
        "_reachable_store_block_mask",
        return_value=None,
    )


def _retention_kwargs(retention: int | None) -> dict:
    """The retention keyword of the tree's RequestRunner (0.32.0:
    retention_interval, the 0.29.0 fork: prefix_cache_retention_interval)."""
    params = inspect.signature(RequestRunner).parameters
    for name in ("retention_interval", "prefix_cache_retention_interval"):
        if name in params:
            return {name: retention}
    if retention is not None:
        raise SystemExit("this tree's RequestRunner takes no retention interval")
    return {}


_SAFETENSORS_METADATA = "vllm.transformers_utils.config.try_get_safetensors_metadata"
_RUNNER_MODULE = "tests.v1.kv_connector.unit.offloading_connector.utils"


def _gpu_retention(retention: int | None):
    """RequestRunner builds its KVCacheConfig by hand, without the interval,
    so its GPU prefix cache would keep every block whatever the connector is
    told; an engine (get_kv_cache_configs) runs it at the interval. Where the
    GPU cache is sparse, a later request finds a shared-prefix junction and
    stores its tail: give the runner's GPU cache the interval."""
    if (
        "prefix_cache_retention_interval"
        not in inspect.signature(KVCacheConfig).parameters
    ):
        return nullcontext()  # a base without sparse retention
    return mock.patch(
        f"{_RUNNER_MODULE}.KVCacheConfig",
        functools.partial(KVCacheConfig, prefix_cache_retention_interval=retention),
    )


def _engine_config(eagle_drafter: bool, mamba_cache_mode: str | None):
    """RequestRunner's config has no speculative config and Mamba's default
    cache mode ("none"), while its groups may be flagged EAGLE or be Mamba
    groups cached in another mode: no engine runs that. Give the config an
    EAGLE drafter (one speculative token, as upstream's shared-group MTP
    tests do), so that the GPU prefix cache drops EAGLE blocks as the
    connector expects, and the Mamba groups' cache mode, so that the
    scheduler splits prefills where Mamba states are cached."""
    if not eagle_drafter and mamba_cache_mode is None:
        return nullcontext()
    module = importlib.import_module(_RUNNER_MODULE)
    make_config = module.create_vllm_config

    def engine_config(*args, **kwargs):
        config = make_config(*args, **kwargs)
        if mamba_cache_mode is not None:
            config.cache_config.mamba_cache_mode = mamba_cache_mode
        if eagle_drafter:
            drafter = mock.MagicMock(name="eagle_drafter")
            drafter.use_eagle.return_value = True
            drafter.use_eagle_block_drop.return_value = True
            drafter.needs_eagle_block_drop.return_value = True
            drafter.disable_eagle_block_drop = False
            drafter.use_multi_module_mtp.return_value = False
            drafter.num_speculative_tokens_per_batch_size = None
            drafter.max_num_new_slots_for_drafting = 0
            drafter.num_speculative_tokens = 1
            config.speculative_config = drafter
        return config

    return mock.patch(f"{_RUNNER_MODULE}.create_vllm_config", engine_config)


def _mamba_cache_mode(kv_cache_groups: list[KVCacheGroupSpec]) -> str | None:
    modes = {
        g.kv_cache_spec.mamba_cache_mode
        for g in kv_cache_groups
        if isinstance(g.kv_cache_spec, MambaSpec)
    }
    assert len(modes) <= 1, f"one Mamba cache mode per engine, not {modes}"
    return next(iter(modes), None)


@contextmanager
def _attention_shaped_mamba_pages():
    """RequestRunner shapes every worker KV tensor as attention's (blocks, 2,
    block_size, num_kv_heads, head_size) of the spec's dtype; a MambaSpec has
    none of these. While it builds them, a Mamba layer reads as one float32
    head whose tensor holds exactly the spec's page per block: the worker
    views each layer as (blocks, page bytes) and never reads the state.
    (Newer runners assert each spec is an AttentionSpec first.)"""
    runner = importlib.import_module(_RUNNER_MODULE)
    with (
        mock.patch.object(
            runner,
            "AttentionSpec",
            (getattr(runner, "AttentionSpec", MambaSpec), MambaSpec),
            create=True,
        ),
        mock.patch.object(MambaSpec, "num_kv_heads", 1, create=True),
        mock.patch.object(
            MambaSpec,
            "head_size",
            property(lambda spec: spec.page_size_bytes // (8 * spec.block_size)),
            create=True,
        ),
        mock.patch.object(MambaSpec, "dtype", torch.float32, create=True),
    ):
        yield


class OffloadSim:
    """``retention``: None / 0 / k as the engine setting, or EVERY_CHUNK for a
    reference whose stores skip nothing. ``gpu_retention``: the GPU prefix
    cache's interval (default: the engine setting; None for EVERY_CHUNK).
    ``eagle_drafter``: the engine runs an EAGLE drafter (see _engine_config).
    Mamba groups (``mamba``) run in their cache mode."""

    def __init__(
        self,
        kv_cache_groups: list[KVCacheGroupSpec],
        retention: int | None | str,
        offload_prompt_only: bool = True,
        blocks_per_chunk: int = 1,
        async_scheduling: bool = False,
        gpu_retention: int | None | str = AS_ENGINE,
        eagle_drafter: bool = False,
    ):
        self.every_chunk = retention == EVERY_CHUNK
        self.full_attention_groups = {
            i
            for i, g in enumerate(kv_cache_groups)
            if isinstance(g.kv_cache_spec, FullAttentionSpec)
        }
        if self.every_chunk:
            retention = None
        if gpu_retention == AS_ENGINE:
            gpu_retention = retention
        block_size = min(g.kv_cache_spec.block_size for g in kv_cache_groups)
        # Offline, the hub client retries the weights metadata with a sleep
        # before giving up; its answer (none) is known here.
        with (
            mock.patch(_SAFETENSORS_METADATA, return_value=None),
            _gpu_retention(gpu_retention),
            _engine_config(eagle_drafter, _mamba_cache_mode(kv_cache_groups)),
            _attention_shaped_mamba_pages(),
        ):
            self.runner = RequestRunner(
                block_size=block_size,
                blocks_per_chunk=blocks_per_chunk,
                num_gpu_blocks=2000,
                async_scheduling=async_scheduling,
                kv_cache_groups=kv_cache_groups,
                extra_config_overrides={"offload_prompt_only": offload_prompt_only},
                **_retention_kwargs(retention),
            )
        self.stored: set[OffloadKey] = set()
        self.looked_up_hits: set[OffloadKey] = set()
        self.hits: list[int | None] = []
        manager = self.runner.manager
        manager.prepare_store.side_effect = self._prepare_store
        manager.prepare_load.side_effect = self._prepare_load
        manager.lookup.side_effect = self._lookup
        connector = self.runner.connector_scheduler
        matched = connector.get_num_new_matched_tokens

        def record_hit(request, num_computed_tokens, **kwargs):
            result = matched(request, num_computed_tokens, **kwargs)
            self.hits.append(result[0])
            return result

        connector.get_num_new_matched_tokens = record_hit

    def _prepare_store(self, keys, req_context):
        keys = list(keys)
        self.stored.update(keys)
        return generate_store_output(keys)

    def _prepare_load(self, keys, req_context):
        # A load restores exactly these chunks: one the tier does not hold
        # would be read as KV (the CPU tier's prepare_load asserts).
        missing = [key for key in keys if key not in self.stored]
        assert not missing, f"load of {len(missing)} chunk(s) the tier does not hold"
        return MockLoadStoreSpec(keys)

    def _lookup(self, key, req_context):
        if key in self.stored:
            self.looked_up_hits.add(key)
            return LookupResult.HIT
        return LookupResult.MISS

    def run(self, token_ids: list[int], kv_transfer_params: dict | None = None) -> int:
        """Run one request to its end; return its external hit tokens."""
        self.hits.clear()
        self.runner.new_request(
            token_ids=token_ids, kv_transfer_params=kv_transfer_params
        )
        with _no_masks() if self.every_chunk else nullcontext():
            self.runner._run(decoded_tokens=[EOS_TOKEN_ID], complete_transfers=True)
        assert self.hits, "the connector was never asked for matched tokens"
        return self.hits[0] or 0

    def gpu_lookup(self, token_ids: list[int]) -> tuple[int, int]:
        """What the GPU prefix cache holds now for a new request with these
        tokens, without allocating: its hit tokens and the shared-prefix
        junction it would pin (0 if none)."""
        sampling_params = SamplingParams(max_tokens=1)
        sampling_params.update_from_generation_config({}, EOS_TOKEN_ID)
        request = Request(
            request_id=f"gpu-lookup-{len(token_ids)}",
            prompt_token_ids=token_ids,
            sampling_params=sampling_params,
            pooling_params=None,
            block_hasher=self.runner._block_hasher,
        )
        found = self.runner.scheduler.kv_cache_manager.get_computed_blocks(request)
        # A base without shared-prefix junctions answers (blocks, hit).
        return found[1], found[2] if len(found) > 2 else 0

    def replay_hit(self, token_ids: list[int]) -> int:
        """External hit of a new request after the GPU prefix cache is reset."""
        self.runner.scheduler.reset_prefix_cache()
        return self.run(token_ids)

    def probe_hit(self, token_ids: list[int], stored: set[OffloadKey]) -> int:
        """replay_hit against exactly ``stored`` (e.g. what one request
        stored): the probe's own stores do not reach later probes."""
        self.stored = set(stored)
        return self.replay_hit(token_ids)

    def every_chunk_keys(self, token_ids: list[int]) -> set[OffloadKey]:
        """Every chunk a request with these tokens stores with no mask: what
        a request extending a stored one adds past the stored end when it
        computes it (a follow-up turn the GPU prefix cache misses there)."""
        with _no_masks():
            self.probe_hit(token_ids, set())
        return set(self.stored)

    def full_attention_keys(self, token_ids: list[int]) -> set[OffloadKey]:
        """The full-attention chunks a request with these tokens stores: what
        a request extending a stored one adds when it hits the GPU prefix
        cache past the stored end (its other groups' blocks before that hit
        are null and never stored)."""
        return {
            k
            for k in self.every_chunk_keys(token_ids)
            if get_offload_group_idx(k) in self.full_attention_groups
        }
