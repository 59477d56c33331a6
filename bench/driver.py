# SPDX-License-Identifier: Apache-2.0
"""Drive vLLM's real v1 ``Scheduler`` with the real ``OffloadingConnector``
(scheduler side) over one geometry and workload, for whatever vLLM tree is
first on ``sys.path`` (the fork or stock 0.29.0: the caller picks it).

Per run: pass 1 submits the workload and records the chunks the connector
stores (bytes = chunks x the group's bytes per chunk) and the CPU time the
series can add on the scheduler side (the connector's hooks and the KV cache
managers' ``reachable_block_mask``) per scheduled token; pass 2 resets the
GPU prefix cache before each request and replays every request, and probes
every aligned boundary of every stored sequence (prompt and output) one at a
time against the offload store of pass 1, recording the external hit tokens.

A run's ``tree`` is "stock", "fork" or "every": the fork with its store masks
switched off, i.e. storing every complete chunk (the reference for hits).

    python -m bench.driver CONFIG.json OUT.jsonl   (one JSON line per run)

CONFIG: {"runs": [{"geometry", "workload", "variant", "retention", "tree"}...],
"quick": bool}. A run may carry "offload_retention": the OffloadingConnector's
own retention interval (``retention_interval`` in its extra config); absent,
the connector follows the GPU prefix cache's ``retention``. The run records
the interval the connector used and raises if it is not the one asked for.
"""

import contextlib
import gc
import json
import math
import os
import sys
import time
from itertools import chain
from pathlib import Path

import numpy as np

from bench.geometries import BUILDERS
from bench.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[1]
MODEL_FIXTURE = ROOT / "tests" / "fixtures" / "hf" / "facebook--opt-125m"
MAX_MODEL_LEN = 32768
NUM_GPU_BLOCKS = 30000
# Probes per run at most (aligned boundaries of every stored sequence, one
# in every `stride` when there are more); quick runs probe fewer.
MAX_PROBES = {False: 3000, True: 300}
# Workload variants: how the engine is configured around the same requests.
VARIANTS = {
    "default": {},
    # Decode tokens offloaded too (offload_prompt_only=false).
    "decode": {"connector": {"offload_prompt_only": False}},
    # A realistic batch budget: long prompts prefill in 2048-token chunks.
    "batch2048": {"scheduler": {"max_num_batched_tokens": 2048}},
    # Few GPU blocks (about 6 GSM8K-like requests on DeepSeek-V4): requests
    # are preempted and recomputed.
    "smallgpu": {"num_gpu_blocks": 3000, "max_model_len": 4096},
}
HOOKS = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "request_finished",
    "update_connector_output",
)


def log(msg: str) -> None:
    print(f"[driver pid {os.getpid()}] {msg}", file=sys.stderr, flush=True)


# The offload interval of a tree whose connector has none of its own (stock
# 0.29.0 stores every chunk whatever the GPU prefix cache retains).
NO_OFFLOAD_INTERVAL = "none of its own"


class OffloadRetentionMismatch(RuntimeError):
    """The connector runs at another offload interval than the run asked for
    (a tree that ignores the key): its table would be silently wrong."""


def offload_extra_config(spec: dict) -> dict:
    """The connector's extra config for a run's own offload interval: the key
    only when the run asks for one (absent: the GPU prefix cache's)."""
    if "offload_retention" not in spec:
        return {}
    return {"retention_interval": spec["offload_retention"]}


def checked_offload_retention(sim: "Sim", spec: dict, gpu_retention):
    """The offload interval the connector's scheduler side uses; raises
    OffloadRetentionMismatch when the run asked for another one (without
    "offload_retention", the GPU's, where the tree has an interval at all)."""
    effective = getattr(sim.cs.config, "retention_interval", NO_OFFLOAD_INTERVAL)
    asked = "offload_retention" in spec
    requested = spec["offload_retention"] if asked else gpu_retention
    if effective != requested and (asked or effective != NO_OFFLOAD_INTERVAL):
        raise OffloadRetentionMismatch(
            f"{spec['geometry']} {spec['workload']}: asked for offload interval "
            f"{requested!r} (GPU {gpu_retention!r}), the connector uses "
            f"{effective!r}"
        )
    return effective


QUICK_SIZES = {
    "gsm8k": {"num_prompts": 40},
    "agentic": {"num_sessions": 4, "num_turns": 4},
    "longdoc": {"num_docs": 2, "num_questions": 2},
}


def workload(name: str, quick: bool):
    return WORKLOADS[name](**(QUICK_SIZES[name] if quick else {}))


# --- vLLM setup ----------------------------------------------------------------


def group_info(kv_cache_config, worker_config):
    """Per group: kind, tokens per chunk, lookup window in chunks, bytes/chunk."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MambaSpec,
        SlidingWindowSpec,
        UniformTypeKVCacheSpecs,
    )

    groups = []
    for group, worker_group in zip(
        kv_cache_config.kv_cache_groups, worker_config.kv_cache_groups
    ):
        spec = group.kv_cache_spec
        wspec = worker_group.kv_cache_spec
        if isinstance(wspec, UniformTypeKVCacheSpecs):
            nbytes = wspec.page_size_bytes  # already summed over its layers
        else:
            nbytes = wspec.page_size_bytes * len(worker_group.layer_names)
        tpc = spec.block_size  # blocks_per_chunk = 1 (the connector default)
        if isinstance(spec, SlidingWindowSpec):
            kind, window = "swa", math.ceil(spec.sliding_window / tpc)
        elif isinstance(spec, MambaSpec):
            kind, window = "mamba", 1
        else:
            assert isinstance(spec, FullAttentionSpec), spec
            kind, window = "full", None
        groups.append(
            {"kind": kind, "tokens_per_chunk": tpc, "window_chunks": window,
             "bytes_per_chunk": nbytes, "layers": len(worker_group.layer_names),
             "spec": type(spec).__name__}
        )  # fmt: skip
    return groups


def build_scheduler(
    geometry_name: str,
    retention,
    connector_config: dict | None = None,
    scheduler_overrides: dict | None = None,
    num_gpu_blocks: int = NUM_GPU_BLOCKS,
    max_model_len: int = MAX_MODEL_LEN,
):
    """``connector_config`` overrides the OffloadingConnector's extra config
    (default: the recording spec); ``scheduler_overrides`` SchedulerConfig
    fields (e.g. max_num_batched_tokens)."""
    import vllm
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_request_block_hasher,
        init_none_hash,
        resolve_kv_cache_block_sizes,
    )

    try:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    except ImportError:  # 0.33.0: the planning module, given the global groups

        def get_kv_cache_configs(config, specs, memory):
            from vllm.v1.core import kv_cache_planning as planning

            groups = planning.get_global_kv_cache_groups(config, specs)
            return planning.get_kv_cache_configs(config, specs, memory, groups)

    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    geo = BUILDERS[geometry_name]()
    model_config = ModelConfig(
        model=str(MODEL_FIXTURE),
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        hf_overrides={"max_position_embeddings": max_model_len},
    )
    cache_config = CacheConfig(
        block_size=geo.block_size,
        enable_prefix_caching=True,
        cache_dtype=geo.cache_dtype,
        mamba_cache_mode=geo.mamba_cache_mode,
        mamba_block_size=geo.mamba_block_size,
    )
    cache_config.kv_cache_layout = geo.kv_cache_layout
    cache_config.prefix_cache_retention_interval = retention
    cache_config.num_gpu_blocks_override = num_gpu_blocks
    scheduler_config = SchedulerConfig(
        **{
            "max_num_seqs": 32,
            "max_num_batched_tokens": 8192,
            "max_model_len": max_model_len,
            "enable_chunked_prefill": True,
            "is_encoder_decoder": False,
            "disable_hybrid_kv_cache_manager": False,
            **(scheduler_overrides or {}),
        }
    )
    kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config=connector_config
        or {"spec_name": "RecordingSpec", "spec_module_path": "bench.recording"},
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=scheduler_config,
        kv_transfer_config=kv_transfer_config,
        device_config=DeviceConfig("cpu"),
    )
    with set_current_vllm_config(vllm_config):
        worker_configs = get_kv_cache_configs(vllm_config, [dict(geo.specs)], [1 << 50])
        kv_cache_config = generate_scheduler_kv_cache_config(worker_configs)
        cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        block_size, hash_block_size = resolve_kv_cache_block_sizes(
            kv_cache_config, vllm_config
        )
        scheduler = Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=block_size,
            hash_block_size=hash_block_size,
        )
    init_none_hash(sha256)
    hasher = get_request_block_hasher(hash_block_size, sha256)
    groups = group_info(kv_cache_config, worker_configs[0])
    return vllm, vllm_config, scheduler, hasher, groups, geo


# reachable_block_mask timing: the Sim being measured, and whether a timed
# hook is running (then the hook's own timer counts the mask).
_MASK_TIMING: dict = {"sim": None, "depth": 0, "wrapped": False}


def _timed_mask(fn):
    def timed(klass, *args, **kwargs):
        if _MASK_TIMING["depth"]:
            return fn(klass, *args, **kwargs)
        t0 = time.thread_time_ns()
        try:
            return fn(klass, *args, **kwargs)
        finally:
            _MASK_TIMING["sim"].hook_ns += time.thread_time_ns() - t0

    return timed


class Sim:
    """The scheduler plus a fake model and an instant offloading worker."""

    def __init__(self, geometry: str, retention, **build_kwargs):
        (self.vllm, self.vllm_config, self.scheduler, self.hasher, self.groups,
         self.geometry) = build_scheduler(geometry, retention, **build_kwargs)  # fmt: skip
        connector = self.scheduler.connector
        self.cs = connector.connector_scheduler
        self.manager = self.cs.manager
        self.outputs: dict[str, list[int]] = {}
        self.first_hit: dict[str, int] = {}
        self.hook_ns = 0
        # Hook CPU time of each step: repetitions of a deterministic run take
        # the same steps, so the per-step minimum across them filters out
        # what other processes cost this one (caches, preemption).
        self.step_ns: list[int] = []
        self.steps = 0
        self.scheduled_tokens = 0
        self.preemptions = 0
        self.next_id = 0
        self._time_block_masks()
        for name in HOOKS:
            setattr(self.cs, name, self._timed(getattr(self.cs, name)))
        preempt = self.scheduler._preempt_request

        def count_preemption(*args, **kwargs):
            self.preemptions += 1
            return preempt(*args, **kwargs)

        self.scheduler._preempt_request = count_preemption
        matched = self.cs.get_num_new_matched_tokens

        # Newer releases pass more arguments (0.32.0: max_num_new_tokens).
        def record_hit(request, num_computed_tokens, *args, **kwargs):
            result = matched(request, num_computed_tokens, *args, **kwargs)
            if result[0] is not None:
                self.first_hit.setdefault(request.request_id, result[0])
            return result

        self.cs.get_num_new_matched_tokens = record_hit

    def _timed(self, fn):
        # CPU time of this thread: what the hooks cost, not what the rest of
        # the machine was doing meanwhile.
        def timed(*args, **kwargs):
            _MASK_TIMING["depth"] += 1
            t0 = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.hook_ns += time.thread_time_ns() - t0
                _MASK_TIMING["depth"] -= 1

        return timed

    def _time_block_masks(self) -> None:
        """Time the KV cache managers' reachable_block_mask too: the GPU
        prefix cache calls it in schedule() (the series changes it), and so
        does the fork's connector (counted once: inside a hook it is not
        timed again). The classes are wrapped once per process."""
        from vllm.v1.core.single_type_kv_cache_manager import (
            SingleTypeKVCacheManager,
        )

        _MASK_TIMING["sim"] = self
        if _MASK_TIMING["wrapped"]:
            return
        _MASK_TIMING["wrapped"] = True
        todo = [SingleTypeKVCacheManager]
        while todo:
            cls = todo.pop()
            todo += cls.__subclasses__()
            if "reachable_block_mask" in vars(cls):
                fn = vars(cls)["reachable_block_mask"].__func__
                setattr(cls, "reachable_block_mask", classmethod(_timed_mask(fn)))

    def add(self, prompt: list[int], output: list[int]) -> str:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        req_id = f"r{self.next_id}"
        self.next_id += 1
        params = SamplingParams(max_tokens=len(output), ignore_eos=True)
        params.update_from_generation_config({}, 2)
        self.outputs[req_id] = output
        self.scheduler.add_request(
            Request(
                request_id=req_id,
                prompt_token_ids=prompt,
                sampling_params=params,
                pooling_params=None,
                block_hasher=self.hasher,
            )
        )
        return req_id

    def step(self) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        scheduler = self.scheduler
        hook_ns = self.hook_ns
        out = scheduler.schedule()
        self.scheduled_tokens += out.total_num_scheduled_tokens
        meta = out.kv_connector_metadata
        # The worker finishes every transfer within the step.
        completed = {job: 1 for job in chain(meta.load_jobs, meta.store_jobs)}
        loaded = {job.req_id for job in meta.load_jobs.values()}
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            req = scheduler.requests[req_id]
            done = req.num_computed_tokens >= req.num_tokens  # prefill finished
            sampled.append(
                [self.outputs[req_id][req.num_output_tokens]] if done else []
            )
        scheduler.update_from_output(
            out,
            ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=sampled,
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=None,
                kv_connector_output=KVConnectorOutput(
                    finished_sending=set(),
                    finished_recving=loaded,
                    kv_connector_worker_meta=OffloadingWorkerMetadata(
                        completed_jobs=completed
                    ),
                ),
            ),
        )
        self.steps += 1
        self.step_ns.append(self.hook_ns - hook_ns)

    def drain(self) -> None:
        s = self.scheduler
        while s.requests or s.finished_req_ids or self.cs._jobs:
            self.step()

    def store_bytes(self) -> int:
        per_group = self.manager.stored_per_group
        return sum(n * self.groups[g]["bytes_per_chunk"] for g, n in per_group.items())

    def replay_hit(self, prompt: list[int]) -> int:
        """External hit of a fresh request with an empty GPU prefix cache,
        against the pass-1 store only (the replay's own stores are undone)."""
        snapshot = set(self.manager.stored)
        assert self.scheduler.reset_prefix_cache()
        req_id = self.add(prompt, [1])
        self.drain()
        self.manager.stored = snapshot
        return self.first_hit.get(req_id, 0)


# --- The theoretical minimum ---------------------------------------------------


def alignment(groups) -> int:
    full = {g["tokens_per_chunk"] for g in groups if g["kind"] == "full"}
    if len(full) == 1:
        return full.pop()
    return math.lcm(*(g["tokens_per_chunk"] for g in groups))


def prefix_ids(tokens: list[int], step: int) -> list[int]:
    """ids[i] identifies tokens[: (i + 1) * step]."""
    ids, h = [], 0
    for end in range(step, len(tokens) + 1, step):
        h = hash((h, tuple(tokens[end - step : end])))
        ids.append(h)
    return ids


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def stored_lengths(requests, decode: bool) -> list[int]:
    """Tokens each request's stores cover: its prompt, or with decode
    offloading its prompt and output (the connector stores up to the
    request's length once it finishes)."""
    return [len(p) + (len(o) if decode else 0) for p, o in requests]


def boundaries(requests, align: int, retention, decode: bool = False) -> list[set[int]]:
    """Hit boundaries each request's stores must serve, from the workload alone.

    Each request stores its prompt (prompt-only offloading) or, with
    ``decode``, its prompt + output: the stored sequence, m tokens.
    Dense (None, and stock): every aligned position up to m.
    Sparse, following vLLM's retained checkpoints:
    - replay: the hit a repeat of the prompt gets, floor((P - 1) / A) * A,
      and the prompt end, floor(P / A) * A, where a follow-up turn that
      extends the prompt hits (the series keeps both);
    - with ``decode``, the stored end, floor(m / A) * A, where a follow-up
      turn that extends the prompt + output hits (what decode offloading
      stores for);
    - offload hit: a later prompt's longest common prefix with an earlier
      stored sequence, kept by the earlier one;
    - shared-prefix junction: a later prompt's longest common prefix with an
      earlier prompt + output (what the GPU prefix cache held when the later
      one arrived), kept by the later one (vLLM's shared_prefix_boundary);
    - an interval k > 0: every multiple of k up to m (the GPU prefix cache
      keeps them on the output's blocks too).
    Without ``decode`` (m = P) this is the prompt-only minimum."""
    prompts = [np.asarray(p) for p, _ in requests]
    seqs = [np.asarray(p + o) for p, o in requests]
    lengths = stored_lengths(requests, decode)
    stored = [s[:m] for s, m in zip(seqs, lengths)]
    out = [set() for _ in requests]
    for i, (p, m) in enumerate(zip(prompts, lengths)):
        n = len(p)
        if retention is None:
            out[i].update(range(align, m + 1, align))
            continue
        out[i].update(
            ((n - 1) // align * align, n // align * align, m // align * align)
        )
        if retention:
            out[i].update(range(retention, m + 1, retention))
        hit, owner, junction = 0, None, 0
        for j in range(i):
            shared = min(lcp(p, stored[j]), lengths[j], n - 1) // align * align
            if shared > hit:
                hit, owner = shared, j
            junction = max(junction, min(lcp(p, seqs[j]), n - 1) // align * align)
        if owner is not None:
            out[owner].add(hit)
        out[i].add(junction)
    return [{b for b in s if b > 0} for s in out]


def minimum_bytes(requests, groups, retention, decode: bool = False) -> tuple[int, int]:
    """(theoretical minimum bytes, bytes of storing every complete chunk) of
    the stored sequences (prompts; with ``decode``, prompts + outputs)."""
    align = alignment(groups)
    step = math.gcd(*(g["tokens_per_chunk"] for g in groups))
    needed, everything = set(), set()
    bounds_all = boundaries(requests, align, retention, decode)
    lengths = stored_lengths(requests, decode)
    for (prompt, output), m, bounds in zip(requests, lengths, bounds_all):
        ids = prefix_ids((prompt + output)[:m], step)
        for gi, g in enumerate(groups):
            per = g["tokens_per_chunk"] // step
            chunk_id = lambda c: (gi, ids[(c + 1) * per - 1])  # noqa: E731
            n_chunks = m // g["tokens_per_chunk"]
            everything.update(chunk_id(c) for c in range(n_chunks))
            for b in bounds:
                end = b // g["tokens_per_chunk"]
                start = 0 if g["kind"] == "full" else max(0, end - g["window_chunks"])
                needed.update(chunk_id(c) for c in range(start, end))
    size = lambda keys: sum(groups[g]["bytes_per_chunk"] for g, _ in keys)  # noqa: E731
    return size(needed), size(everything)


def probes(rounds, align: int, max_probes: int, seed: int = 7):
    """Requests sharing exactly one aligned prefix of a stored sequence, then
    fresh tokens: every multiple of the alignment in every request's prompt +
    output, each distinct prefix once (one in every `stride` when there are
    more than max_probes; the prompts' replay boundaries always).
    Returns [(prompt, boundary, is_replay_boundary)]."""
    import random

    rng = random.Random(seed)
    seen: dict[int, tuple] = {}
    for round_ in rounds:
        for prompt, output in round_:
            seq = prompt + output
            replay = (len(prompt) - 1) // align * align
            for i, pid in enumerate(prefix_ids(seq, align)):
                b = (i + 1) * align
                old = seen.get(pid)
                seen[pid] = (seq, b, b == replay or (old is not None and old[2]))
    items = list(seen.values())
    stride = max(1, math.ceil(len(items) / max_probes))
    kept = [x for i, x in enumerate(items) if i % stride == 0 or x[2]]
    fresh = lambda: [rng.randrange(100, 32000) for _ in range(40)]  # noqa: E731
    return [(seq[:b] + fresh(), b, replay) for seq, b, replay in kept]


# --- One run -------------------------------------------------------------------


def run(spec: dict, quick: bool) -> dict:
    from unittest import mock

    geometry, name, retention = spec["geometry"], spec["workload"], spec["retention"]
    tree, variant = spec["tree"], VARIANTS[spec["variant"]]
    t0 = time.time()
    connector = {
        "spec_name": "RecordingSpec",
        "spec_module_path": "bench.recording",
        **variant.get("connector", {}),
        **offload_extra_config(spec),
    }
    try:
        # Like for like: every tree's GPU prefix cache runs at the setting's
        # retention (stock's connector ignores it, its GPU cache does not).
        sim = Sim(
            geometry,
            retention,
            connector_config=connector,
            scheduler_overrides=variant.get("scheduler"),
            num_gpu_blocks=variant.get("num_gpu_blocks", NUM_GPU_BLOCKS),
            max_model_len=variant.get("max_model_len", MAX_MODEL_LEN),
        )
    except (ValueError, AssertionError) as e:
        log(f"{geometry} {name} retention={retention}: rejected: {e}")
        return {**spec, "error": f"{type(e).__name__}: {e}"}
    offload_retention = checked_offload_retention(sim, spec, retention)
    # As a vLLM engine does after start-up (EngineCore: freeze_gc_heap), keep
    # the start-up heap, and what earlier cells of this process left, out of
    # the collector's passes: a full collection over them inside a hook would
    # be charged to this cell (one such pass cost a small cell 4x its hooks).
    gc.collect()
    gc.freeze()
    # The reference stores every complete chunk: the fork without its masks.
    every = mock.patch(
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler."
        "reachable_chunk_mask",
        return_value=None,
    )
    with every if tree == "every" else contextlib.nullcontext():
        rounds = workload(name, quick)
        for round_ in rounds:
            for prompt, output in round_:
                sim.add(prompt, output)
            sim.drain()
        store = sim.store_bytes()
        # Pass 1's keys, per group: the replays and probes below undo their
        # stores in ``stored`` but not in these counts.
        stored_chunks = dict(sorted(sim.manager.stored_per_group.items()))
        hook_ns, steps, tokens = sim.hook_ns, sim.steps, sim.scheduled_tokens
        step_ns = sim.step_ns[:steps]
        prompts = [p for r in rounds for p, _ in r]
        align = alignment(sim.groups)
        # Hits are deterministic: a cost-only repetition skips them.
        replay, probe_hits = [], []
        if spec.get("probe", True):
            replay = [sim.replay_hit(p) for p in prompts]
            probe_hits = [
                {"boundary": b, "replay": is_replay, "hit": sim.replay_hit(p)}
                for p, b, is_replay in probes(rounds, align, MAX_PROBES[quick])
            ]
    gc.unfreeze()
    # The minimum at the interval the offload stores keep hits for.
    minimum, everything = minimum_bytes(
        [r for round_ in rounds for r in round_],
        sim.groups,
        offload_retention if "offload_retention" in spec else retention,
        decode=connector.get("offload_prompt_only") is False,
    )
    result = {
        **spec,
        "offload_retention_effective": offload_retention,
        "vllm_file": sim.vllm.__file__,
        "store_bytes": store,
        "min_store_bytes": minimum,
        "store_all_bytes": everything,
        "stored_chunks": stored_chunks,
        "replay_hits": replay,
        "hit_tokens": sum(replay),
        "probe_hits": probe_hits,
        "hook_ns": hook_ns,
        "step_ns": step_ns,
        "steps": steps,
        "scheduled_tokens": tokens,
        "preemptions": sim.preemptions,
        # The cost figure: scheduler-side CPU time the series can change, per
        # scheduled token.
        "cpu_ns_per_token": hook_ns / max(tokens, 1),
        "groups": sim.groups,
        "alignment_tokens": align,
        "geometry_source": sim.geometry.source,
        "geometry_notes": sim.geometry.notes,
        "num_requests": len(prompts),
        "seconds": round(time.time() - t0, 1),
    }
    log(
        f"{geometry} {name} {spec['variant']} {tree} {retention}: "
        f"{store / 2**20:.1f} MiB stored, min {minimum / 2**20:.1f} MiB, "
        f"hits {sum(replay)}, {len(probe_hits)} probes, "
        f"{result['cpu_ns_per_token']:.0f} ns/token, {result['seconds']} s"
    )
    return result


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    import vllm

    log(f"vllm from {vllm.__file__}")
    with open(sys.argv[2], "a") as out:
        for spec in config["runs"]:
            out.write(json.dumps(run(spec, config.get("quick", False))) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
