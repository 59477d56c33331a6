# SPDX-License-Identifier: Apache-2.0
"""Drive vLLM's real v1 ``Scheduler`` with the real ``OffloadingConnector``
(scheduler side) over one geometry and workload, for whatever vLLM tree is
first on ``sys.path`` (the fork or stock 0.29.0: the caller picks it).

Per run: pass 1 submits the workload and records the chunks the connector
stores (bytes = chunks x the group's bytes per chunk) and the time spent in
the connector's scheduler hooks; pass 2 resets the GPU prefix cache before
each request and replays every request (and a few probes) one at a time with
the offload store of pass 1, recording the external hit tokens.

    python -m bench.driver CONFIG.json OUT.jsonl   (one JSON line per run)

CONFIG: {"runs": [{"geometry", "workload", "retention", "stock"}...],
"quick": bool, "repeats": int}.
"""

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
HOOKS = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "request_finished",
    "update_connector_output",
)


def log(msg: str) -> None:
    print(f"[driver pid {os.getpid()}] {msg}", file=sys.stderr, flush=True)


def workload(name: str, quick: bool):
    if quick:
        return WORKLOADS[name](**({"num_prompts": 40} if name == "gsm8k" else
                                  {"num_sessions": 4, "num_turns": 4}))  # fmt: skip
    return WORKLOADS[name]()


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


def build_scheduler(geometry_name: str, retention):
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
        get_kv_cache_configs,
        get_request_block_hasher,
        init_none_hash,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    geo = BUILDERS[geometry_name]()
    model_config = ModelConfig(
        model=str(MODEL_FIXTURE),
        skip_tokenizer_init=True,
        max_model_len=MAX_MODEL_LEN,
        hf_overrides={"max_position_embeddings": MAX_MODEL_LEN},
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
    cache_config.num_gpu_blocks_override = NUM_GPU_BLOCKS
    scheduler_config = SchedulerConfig(
        max_num_seqs=32,
        max_num_batched_tokens=8192,
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        disable_hybrid_kv_cache_manager=False,
    )
    kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "RecordingSpec",
            "spec_module_path": "bench.recording",
        },
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


class Sim:
    """The scheduler plus a fake model and an instant offloading worker."""

    def __init__(self, geometry: str, retention):
        (self.vllm, self.vllm_config, self.scheduler, self.hasher, self.groups,
         self.geometry) = build_scheduler(geometry, retention)  # fmt: skip
        connector = self.scheduler.connector
        self.cs = connector.connector_scheduler
        self.manager = self.cs.manager
        self.outputs: dict[str, list[int]] = {}
        self.first_hit: dict[str, int] = {}
        self.hook_ns = 0
        self.steps = 0
        self.next_id = 0
        for name in HOOKS:
            setattr(self.cs, name, self._timed(getattr(self.cs, name)))
        matched = self.cs.get_num_new_matched_tokens

        def record_hit(request, num_computed_tokens):
            result = matched(request, num_computed_tokens)
            if result[0] is not None:
                self.first_hit.setdefault(request.request_id, result[0])
            return result

        self.cs.get_num_new_matched_tokens = record_hit

    def _timed(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.hook_ns += time.perf_counter_ns() - t0

        return timed

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
        out = scheduler.schedule()
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


def boundaries(requests, align: int, retention) -> list[set[int]]:
    """Hit boundaries each prompt's stores must serve, from the workload alone.

    Dense (None, and stock): every aligned position up to the prompt end.
    Sparse, following vLLM's retained checkpoints:
    - replay: the hit a repeat of the prompt gets, floor((P - 1) / A) * A,
      and the prompt end, floor(P / A) * A, where a follow-up turn that
      extends the prompt hits (the series keeps both);
    - offload hit: a later prompt's longest common prefix with an earlier
      prompt (only prompts are stored), kept by the earlier one;
    - shared-prefix junction: a later prompt's longest common prefix with an
      earlier prompt + output (what the GPU prefix cache held when the later
      one arrived), kept by the later one (vLLM's shared_prefix_boundary);
    - an interval k > 0: every multiple of k up to the prompt end."""
    prompts = [np.asarray(p) for p, _ in requests]
    seqs = [np.asarray(p + o) for p, o in requests]
    out = [set() for _ in requests]
    for i, p in enumerate(prompts):
        n = len(p)
        if retention is None:
            out[i].update(range(align, n + 1, align))
            continue
        out[i].update(((n - 1) // align * align, n // align * align))
        if retention:
            out[i].update(range(retention, n + 1, retention))
        hit, owner, junction = 0, None, 0
        for j in range(i):
            shared = min(lcp(p, prompts[j]), len(prompts[j]), n - 1) // align * align
            if shared > hit:
                hit, owner = shared, j
            junction = max(junction, min(lcp(p, seqs[j]), n - 1) // align * align)
        if owner is not None:
            out[owner].add(hit)
        out[i].add(junction)
    return [{b for b in s if b > 0} for s in out]


def minimum_bytes(requests, groups, retention) -> tuple[int, int]:
    """(theoretical minimum bytes, bytes of storing every complete chunk)."""
    align = alignment(groups)
    step = math.gcd(*(g["tokens_per_chunk"] for g in groups))
    needed, everything = set(), set()
    bounds_all = boundaries(requests, align, retention)
    for (prompt, _), bounds in zip(requests, bounds_all):
        ids = prefix_ids(prompt, step)
        for gi, g in enumerate(groups):
            per = g["tokens_per_chunk"] // step
            chunk_id = lambda c: (gi, ids[(c + 1) * per - 1])  # noqa: E731
            n_chunks = len(prompt) // g["tokens_per_chunk"]
            everything.update(chunk_id(c) for c in range(n_chunks))
            for b in bounds:
                end = b // g["tokens_per_chunk"]
                start = 0 if g["kind"] == "full" else max(0, end - g["window_chunks"])
                needed.update(chunk_id(c) for c in range(start, end))
    size = lambda keys: sum(groups[g]["bytes_per_chunk"] for g, _ in keys)  # noqa: E731
    return size(needed), size(everything)


def probes(rounds, align: int, seed: int = 7):
    """Requests sharing only a prefix with the workload: (prompt, boundary,
    kind). 'junction': the shared system / few-shot prefix plus fresh tokens;
    'k512': a prompt cut at each multiple of 512 plus fresh tokens."""
    import random

    rng = random.Random(seed)
    fresh = lambda: [rng.randrange(100, 32000) for _ in range(40)]  # noqa: E731
    first = [p for p, _ in rounds[0]]
    shared = lcp(np.asarray(first[0]), np.asarray(first[1]))
    out = [(first[0][:shared] + fresh(), shared // align * align, "junction")]
    last = rounds[-1][0][0]
    for b in range(512, len(last), 512):
        out.append((last[:b] + fresh(), b // align * align, "k512"))
    return out


# --- One run -------------------------------------------------------------------


def run(spec: dict, quick: bool) -> dict:
    geometry, name, retention = spec["geometry"], spec["workload"], spec["retention"]
    t0 = time.time()
    try:
        # Stock 0.29.0's connector ignores the interval; its GPU prefix cache
        # runs with the `vllm serve` default, 0 (CacheConfig).
        sim = Sim(geometry, 0 if spec["stock"] else retention)
    except (ValueError, AssertionError) as e:
        log(f"{geometry} {name} retention={retention}: rejected: {e}")
        return {**spec, "error": f"{type(e).__name__}: {e}"}
    rounds = workload(name, quick)
    for round_ in rounds:
        for prompt, output in round_:
            sim.add(prompt, output)
        sim.drain()
    store = sim.store_bytes()
    hook_ns, steps = sim.hook_ns, sim.steps
    prompts = [p for r in rounds for p, _ in r]
    replay = [sim.replay_hit(p) for p in prompts]
    probe_hits = [
        {"boundary": b, "kind": kind, "hit": sim.replay_hit(p)}
        for p, b, kind in probes(rounds, alignment(sim.groups))
    ]
    minimum, everything = minimum_bytes(
        [r for round_ in rounds for r in round_],
        sim.groups,
        None if spec["stock"] else retention,
    )
    result = {
        **spec,
        "vllm_file": sim.vllm.__file__,
        "store_bytes": store,
        "min_store_bytes": minimum,
        "store_all_bytes": everything,
        "stored_chunks": dict(sorted(sim.manager.stored_per_group.items())),
        "replay_hits": replay,
        "hit_tokens": sum(replay),
        "probe_hits": probe_hits,
        "hook_ns": hook_ns,
        "steps": steps,
        "hook_us_per_step": hook_ns / 1e3 / max(steps, 1),
        "groups": sim.groups,
        "alignment_tokens": alignment(sim.groups),
        "geometry_source": sim.geometry.source,
        "geometry_notes": sim.geometry.notes,
        "num_requests": len(prompts),
        "seconds": round(time.time() - t0, 1),
    }
    log(
        f"{geometry} {name} {'stock' if spec['stock'] else retention}: "
        f"{store / 2**20:.1f} MiB stored, min {minimum / 2**20:.1f} MiB, "
        f"hits {sum(replay)}, {result['hook_us_per_step']:.0f} us/step hooks, "
        f"{result['seconds']} s"
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
