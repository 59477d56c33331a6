# SPDX-License-Identifier: Apache-2.0
"""The one store-then-lookup harness: the PR's StoreLookupSim (upstream-pr/0006,
tests/v1/kv_connector/unit/offloading_connector/test_store_lookup.py), with
what the regression tests (tests/regression) and the defect cases
(bench/replay_cases.py) add to run it as an engine would.

Request A runs to completion and its chunks are stored into an in-memory set;
then the GPU prefix cache is reset and request B is looked up against that set.
The offloading manager is vLLM's test mock, answering from the set. It runs
on the vLLM tree first on sys.path: the fork (0.29.0 + patches/), or another
base with or without upstream-pr/ (a stock base runs the fork's copy of the
harness)."""

import functools
import importlib
import importlib.util
import inspect
from contextlib import contextmanager, nullcontext
from pathlib import Path
from unittest import mock

import torch

from tests.v1.kv_connector.unit.offloading_connector.utils import MockLoadStoreSpec
from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID
from vllm import SamplingParams
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.request import Request

_HARNESS = "tests.v1.kv_connector.unit.offloading_connector.test_store_lookup"
# The fork's tree (scripts/apply_and_build.sh), which carries the harness.
_FORK_TREE = Path(__file__).resolve().parents[1] / "upstream" / "vllm"


def _harness():
    """The harness module of the tree under test, or the fork's where the
    tree has none (a stock base)."""
    try:
        return importlib.import_module(_HARNESS)
    except ModuleNotFoundError as e:
        if e.name != _HARNESS:
            raise
    path = _FORK_TREE / (_HARNESS.replace(".", "/") + ".py")
    if not path.is_file():
        raise SystemExit(f"no {path}: run scripts/apply_and_build.sh first")
    spec = importlib.util.spec_from_file_location("fork_store_lookup", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_store_lookup = _harness()
StoreLookupSim = _store_lookup.StoreLookupSim
# Retention setting of the reference that stores every chunk (no mask at all).
EVERY_CHUNK = _store_lookup.EVERY_CHUNK
# Tiny layers of each kind: the specs' sizes do not matter to the scheduler.
full = _store_lookup._full
swa = _store_lookup._swa
chunked_local = _store_lookup._chunked_local
groups = _store_lookup._groups


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


class OffloadSim(StoreLookupSim):
    """The PR's StoreLookupSim, as an engine runs it. ``retention``: None /
    0 / k as the engine setting, or EVERY_CHUNK for a reference whose stores
    skip nothing. ``gpu_retention``: the GPU prefix cache's interval
    (default: the engine setting; None for EVERY_CHUNK). ``offload_retention``:
    the offload tier's own interval, the connector's "retention_interval"
    (default: the engine setting's). ``eagle_drafter``: the engine runs an
    EAGLE drafter (see _engine_config). Mamba groups (``mamba``) run in their
    cache mode. A load must find what it loads."""

    def __init__(
        self,
        kv_cache_groups: list[KVCacheGroupSpec],
        retention: int | None | str,
        offload_prompt_only: bool = True,
        blocks_per_chunk: int = 1,
        async_scheduling: bool = False,
        gpu_retention: int | None | str = AS_ENGINE,
        eagle_drafter: bool = False,
        offload_retention: int | None | str = AS_ENGINE,
    ):
        # The base switches the masks off by their name on its own base;
        # _no_masks() knows the stock bases too.
        self.no_masks = retention == EVERY_CHUNK
        if self.no_masks:
            retention = None
        if gpu_retention == AS_ENGINE:
            gpu_retention = retention
        # Only trees whose connector reads its own interval take the option.
        own_interval = (
            {}
            if offload_retention == AS_ENGINE
            else {"offload_retention": offload_retention}
        )
        # Offline, the hub client retries the weights metadata with a sleep
        # before giving up; its answer (none) is known here.
        with (
            mock.patch(_SAFETENSORS_METADATA, return_value=None),
            _gpu_retention(gpu_retention),
            _engine_config(eagle_drafter, _mamba_cache_mode(kv_cache_groups)),
            _attention_shaped_mamba_pages(),
        ):
            super().__init__(
                kv_cache_groups,
                retention,
                offload_prompt_only=offload_prompt_only,
                blocks_per_chunk=blocks_per_chunk,
                async_scheduling=async_scheduling,
                **own_interval,
            )
        self.runner.manager.prepare_load.side_effect = self._prepare_load

    def _prepare_load(self, keys, req_context):
        # A load restores exactly these chunks: one the tier does not hold
        # would be read as KV (the CPU tier's prepare_load asserts).
        missing = [key for key in keys if key not in self.stored]
        assert not missing, f"load of {len(missing)} chunk(s) the tier does not hold"
        return MockLoadStoreSpec(keys)

    def run(self, token_ids: list[int], kv_transfer_params: dict | None = None) -> int:
        with _no_masks() if self.no_masks else nullcontext():
            return super().run(token_ids, kv_transfer_params)

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

    def every_chunk_keys(self, token_ids: list[int]) -> set[OffloadKey]:
        """Every chunk a request with these tokens stores with no mask: what
        a request extending a stored one adds past the stored end when it
        computes it (a follow-up turn the GPU prefix cache misses there)."""
        with _no_masks():
            self.probe_hit(token_ids, set())
        return set(self.stored)
