# SPDX-License-Identifier: Apache-2.0
"""Running a real in-process vLLM engine on the CPU platform for the E2E tests,
and the store prediction they compare it with."""

import gc
import os
import random
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from e2e import host_offload
from e2e.tiny_models import VOCAB_SIZE, TinyModel

UNSET = object()  # leave prefix_cache_retention_interval to its default / env

STORE_BYTES = "vllm:kv_offload_store_bytes"
LOAD_BYTES = "vllm:kv_offload_load_bytes"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits"
# From the series' metrics patch: what the retention mask dropped.
SKIPPED_BLOCKS = "vllm:kv_offload_retention_skipped_blocks"
SKIPPED_BYTES = "vllm:kv_offload_retention_skipped_bytes"

# Logprobs of an offload hit and of a reference that computed the same tokens
# in the same batches (only the source of the reused prefix differs) agree to
# this. Measured gap: 0. A bf16 rounding difference anywhere in the model
# moves a logprob by about 1e-3 to 1e-1, an fp32 one by about 1e-6.
LOGPROB_ATOL = 1e-5


def kernel_libraries(pid: int | str = "self") -> list[str]:
    """vLLM kernel libraries mapped into a process: which of vllm._C
    (AVX-512 + BF16), _C_AVX512 or _C_AVX2 the CPU platform picked."""
    with open(f"/proc/{pid}/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/vllm/_C" in line}
    return sorted(os.path.basename(p) for p in paths)


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(n)]


def kv_transfer_config(**extra) -> dict:
    """The OffloadingConnector with the host-copy spec, as a user writes it."""
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": host_offload.HostCopyOffloadingSpec.__name__,
            "spec_module_path": host_offload.__name__,
            "cpu_bytes_to_use": 64 << 20,
            **extra,
        },
    }


def engine_kwargs(
    model: TinyModel,
    interval=UNSET,
    connector: bool = True,
    **extra_config,
) -> dict:
    kwargs = dict(
        model=model.path,
        enforce_eager=True,
        enable_prefix_caching=True,
        disable_hybrid_kv_cache_manager=False,
        skip_tokenizer_init=True,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=2048,
        disable_log_stats=False,
        seed=0,
    )
    kwargs.setdefault("max_num_batched_tokens", 2048)
    kwargs.update(model.engine_kwargs)
    if connector:
        kwargs["kv_transfer_config"] = kv_transfer_config(**extra_config)
    if interval is not UNSET:
        kwargs["prefix_cache_retention_interval"] = interval
    return kwargs


def shutdown_engine(llm) -> None:
    from vllm.distributed import cleanup_dist_env_and_memory

    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


@contextmanager
def running_engine(**kwargs) -> Iterator:
    """One in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0), shut down on
    exit so the next one starts clean."""
    from vllm import LLM

    try:
        llm = LLM(**kwargs)
    except BaseException:
        gc.collect()
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
        raise
    try:
        yield llm
    finally:
        shutdown_engine(llm)


def metrics(llm) -> dict[str, float]:
    """Counter / gauge values by name, summed over label sets."""
    out: dict[str, float] = defaultdict(float)
    for metric in llm.get_metrics():
        value = getattr(metric, "value", None)
        if isinstance(value, (int, float)):
            out[metric.name] += value
    return dict(out)


def delta(after: dict, before: dict) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # of the chosen tokens
    num_cached_tokens: int


def generate(
    llm, prompts: Sequence[list[int]], max_tokens: int = 12
) -> list[Completion]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0
    )
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
    )
    result = []
    for out in outs:
        comp = out.outputs[0]
        chosen = [lp[t].logprob for t, lp in zip(comp.token_ids, comp.logprobs)]
        result.append(Completion(list(comp.token_ids), chosen, out.num_cached_tokens))
    return result


@dataclass
class EngineRun:
    """Passes of batches through one engine, with what it was configured to."""

    interval: object  # the engine's resolved prefix_cache_retention_interval
    block_size: int
    num_groups: int
    hma_disabled: bool
    passes: list[list[Completion]] = field(default_factory=list)
    # Metric deltas per pass.
    stats: list[dict[str, float]] = field(default_factory=list)


def _run_passes(
    kwargs: dict, batches: Sequence[Sequence[list[int]]], reset: bool
) -> EngineRun:
    with running_engine(**kwargs) as llm:
        config = llm.llm_engine.vllm_config
        core = llm.llm_engine.engine_core.engine_core
        kv_cache_config = core.scheduler.kv_cache_config
        run = EngineRun(
            interval=config.cache_config.prefix_cache_retention_interval,
            block_size=config.cache_config.block_size,
            num_groups=len(kv_cache_config.kv_cache_groups),
            hma_disabled=config.scheduler_config.disable_hybrid_kv_cache_manager,
        )
        for i, batch in enumerate(batches):
            if i and reset:
                assert llm.reset_prefix_cache()
            before = metrics(llm)
            run.passes.append(generate(llm, batch))
            run.stats.append(delta(metrics(llm), before))
        return run


def offload_run(
    model: TinyModel, batches: Sequence[Sequence[list[int]]], **kwargs
) -> EngineRun:
    """Pass 1 stores; each later pass runs after reset_prefix_cache() so every
    hit comes from the offload tier."""
    return _run_passes(engine_kwargs(model, **kwargs), batches, reset=True)


def reference_run(
    model: TinyModel, batches: Sequence[Sequence[list[int]]], interval=UNSET
) -> EngineRun:
    """What offload_run must reproduce: the same batches in the same order on
    an engine without any KV connector (same model, same engine settings) and
    without resets, so a later pass gets the same prefix from the GPU prefix
    cache instead. Each pass then computes the same tokens in the same batches
    as the offload run (the tests compare num_cached_tokens), so kernels whose
    rounding depends on the batch shape (bf16 above all) round the same way
    in both and any gap is the loaded state's."""
    kwargs = engine_kwargs(model, interval=interval, connector=False)
    return _run_passes(kwargs, batches, reset=False)


# ---------------------------------------------------------------------------
# What the scheduler-side retention decision keeps, derived from the geometry.
#
# The connector stores whole prompt chunks (offload_prompt_only): a prompt of
# P tokens has C = P // T chunks per group, T = tokens per chunk. A hit on the
# offload tier ends on an alignment boundary b (a multiple of A = the
# full-attention groups' T, or the largest T without full attention). Full
# attention serves any such hit only with every chunk before b: all C chunks
# are stored whatever the interval. A sliding-window group serves it with the
# `need = cdiv(window, T)` chunks ending at b, so a sparse store keeps exactly
# the chunks [b/T - need, b/T) for the boundaries it retains:
#   interval None: every boundary -> all C chunks (dense);
#   interval 0:    the replay boundary floor(P / A) * A only;
#   interval k>0:  the replay boundary and every multiple of k up to P.
# ---------------------------------------------------------------------------


def kept_swa_chunks(
    num_prompt: int, tokens_per_chunk: int, align: int, window: int, interval
) -> set[int]:
    num_chunks = num_prompt // tokens_per_chunk
    if interval is None:
        return set(range(num_chunks))
    need = -(-window // tokens_per_chunk)
    boundaries = {num_prompt // align * align}
    if interval:
        boundaries |= set(range(interval, num_prompt + 1, interval))
    kept: set[int] = set()
    for b in boundaries:
        end = b // tokens_per_chunk
        kept |= {i for i in range(max(0, end - need), end) if i < num_chunks}
    return kept


def predicted_store(
    model: TinyModel,
    prompts: Sequence[list[int]],
    interval,
    tokens_per_chunk: int,
    blocks_per_chunk: int = 1,
    window: int = 32,
) -> tuple[int, int]:
    """(stored bytes, KV blocks the mask dropped) for one storing pass over
    distinct prompts on an attention-only model (full + sliding window)."""
    assert model.mamba_layers == 0
    align = tokens_per_chunk  # every group has the same chunk size here
    block_bytes = model.attn_page_bytes()
    stored = dropped = 0
    for p in prompts:
        num_chunks = len(p) // tokens_per_chunk
        swa = len(kept_swa_chunks(len(p), tokens_per_chunk, align, window, interval))
        stored += num_chunks * blocks_per_chunk * model.full_layers * block_bytes
        stored += swa * blocks_per_chunk * model.swa_layers * block_bytes
        if model.swa_layers:
            dropped += (num_chunks - swa) * blocks_per_chunk
    return stored, dropped


# A Mamba group in "align" mode holds a state only where a prefill step ended
# on a block edge: every step_tokens tokens and at the replay boundary
# R = floor((P - 1) / block) * block (the scheduler ends a step there so the
# replay can hit). Dense stores each of those states; interval 0 keeps only R;
# interval k also the states on multiples of k.


def mamba_state_positions(
    num_prompt: int, block: int, step_tokens: int, interval
) -> set[int]:
    replay = (num_prompt - 1) // block * block
    dense = set(range(step_tokens, replay + 1, step_tokens)) | {replay}
    if interval is None:
        kept = dense
    else:
        kept = {replay} | (
            {p for p in dense if p % interval == 0} if interval else set()
        )
    return kept - {0}


def predicted_mamba_store(
    model: TinyModel,
    prompts: Sequence[list[int]],
    interval,
    block: int,
    step_tokens: int,
) -> int:
    """Stored bytes of one storing pass on the full-attention + Mamba model."""
    stored = 0
    for p in prompts:
        stored += len(p) // block * model.full_layers * model.attn_page_bytes(block)
        states = mamba_state_positions(len(p), block, step_tokens, interval)
        stored += len(states) * model.mamba_layers * model.mamba_state_bytes
    return stored
