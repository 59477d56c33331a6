# SPDX-License-Identifier: Apache-2.0
"""A real vLLM engine (in-process, CPU platform, enforce_eager, prefix caching
and the hybrid KV cache manager on) with the OffloadingConnector and the
host-copy spec, on tiny random-weight hybrid models.

Each engine run: pass 1 stores [A, B]; reset_prefix_cache(); pass 2 replays
[A, B]; reset_prefix_cache(); pass 3 sends [A + x, B + y]. Passes 2 and 3 can
only hit through the offload tier.

Outputs are compared like for like: the reference is an engine without any
connector (same model, same settings, same retention interval) running the
same batches without the resets, so its passes 2 and 3 take the same prefixes
from the GPU prefix cache and compute the same tokens in the same batches
(the tests check num_cached_tokens). Greedy tokens and logprobs must then
agree within LOGPROB_ATOL; measured: 0 on AVX-512 + AMX (vllm._C) and AVX2
(vllm._C_AVX2, tests/e2e/isa_avx2). A reference that runs all four prompts
in one batch differs from pass 1 alone already, through rounding alone: by
0.047 (AVX-512) or 0.031 (AVX2) for the bf16 Granite model, by 4e-6 for the
fp32 Gemma models. A worker that writes zeros instead of the loaded blocks
(the negative control) shows that the comparison can fail."""

import threading

import psutil
import pytest

from e2e.engine_utils import (
    EXTERNAL_HITS,
    LOAD_BYTES,
    LOGPROB_ATOL,
    SKIPPED_BLOCKS,
    SKIPPED_BYTES,
    STORE_BYTES,
    Completion,
    engine_kwargs,
    mamba_state_positions,
    offload_run,
    predicted_mamba_store,
    predicted_store,
    prompt,
    reference_run,
    running_engine,
)
from e2e.tiny_models import BLOCK_SIZE, MAMBA_STEP_TOKENS

A_LEN, B_LEN = 1100, 200  # not multiples of the chunk size
A = prompt(A_LEN, seed=1)
B = prompt(B_LEN, seed=2)
A_EXT = A + prompt(50, seed=3)
B_EXT = B + prompt(70, seed=4)
BATCHES = [[A, B], [A, B], [A_EXT, B_EXT]]


def replay_hit(num_prompt: int, align: int) -> int:
    """Tokens an offload hit can reuse for a prompt sharing num_prompt stored
    tokens: whole alignment units, leaving at least one token to compute."""
    return (num_prompt - 1) // align * align


class Runs:
    """Engine runs shared by the tests of this module, each made once."""

    def __init__(self):
        self._cache = {}

    def get(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


@pytest.fixture(scope="module")
def runs():
    return Runs()


def reference(runs, model, interval):
    """reference_run for the offload runs at this interval (any
    blocks_per_chunk: the connector's setting, not the engine's)."""
    return runs.get(
        ("ref", model.path, interval),
        lambda: reference_run(model, BATCHES, interval=interval),
    )


def run(runs, model, interval, **extra):
    key = (model.path, interval, tuple(sorted(extra.items())))
    return runs.get(
        key, lambda: offload_run(model, BATCHES, interval=interval, **extra)
    )


def logprob_gap(got: Completion, want: Completion) -> float:
    return max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs, strict=True))


def assert_same_shape(r, ref) -> None:
    """Like for like: every pass of the reference reused (from the GPU prefix
    cache) exactly the tokens the offload run loaded, so both computed the
    same tokens in the same batches."""
    assert ref.interval == r.interval and ref.block_size == r.block_size
    for i, (got, want) in enumerate(zip(r.passes, ref.passes, strict=True)):
        hits = [c.num_cached_tokens for c in got]
        assert hits == [c.num_cached_tokens for c in want], f"pass {i + 1}: {hits}"


def assert_same_outputs(got: list, want: list) -> float:
    """Identical greedy tokens and logprobs; returns the largest logprob gap."""
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.token_ids == w.token_ids, f"prompt {i}: {g.token_ids} != {w.token_ids}"
        worst = max(worst, logprob_gap(g, w))
    assert worst <= LOGPROB_ATOL, worst
    return worst


def check_offload_run(r, ref, align: int, record_property, tag: str = "") -> None:
    assert not r.hma_disabled, "hybrid KV cache manager must be on"
    stored, replay, extended = r.stats
    # Pass 1: nothing to load yet, something stored.
    assert stored.get(EXTERNAL_HITS, 0) == 0
    assert stored[STORE_BYTES] > 0
    assert [c.num_cached_tokens for c in r.passes[0]] == [0, 0]
    # Passes 2 and 3: every reusable token comes back from the offload tier.
    want_hits = [replay_hit(A_LEN, align), replay_hit(B_LEN, align)]
    for stats, comps in ((replay, r.passes[1]), (extended, r.passes[2])):
        assert [c.num_cached_tokens for c in comps] == want_hits
        assert stats[EXTERNAL_HITS] == sum(want_hits)
        assert stats[LOAD_BYTES] > 0
    assert_same_shape(r, ref)
    worst = assert_same_outputs(sum(r.passes, []), sum(ref.passes, []))
    record_property(f"hits{tag}", want_hits)
    record_property(f"load_bytes{tag}", replay[LOAD_BYTES])
    record_property(f"max_logprob_gap{tag}", worst)


# -- item 1: store, reset, reload; identical outputs -------------------------


@pytest.mark.parametrize("interval", [None, 0, 512])
def test_gemma3_hybrid_reloads_from_offload_tier_identically(
    runs, gemma_hybrid, interval, record_property
):
    r = run(runs, gemma_hybrid, interval)
    assert r.interval == interval
    assert r.num_groups == 2  # full attention + sliding window
    ref = reference(runs, gemma_hybrid, interval)
    check_offload_run(r, ref, BLOCK_SIZE, record_property)
    # Loads are exact: the full-attention group reloads every hit block, the
    # sliding-window group only the cdiv(window, block) blocks before the hit.
    page = gemma_hybrid.attn_page_bytes()
    for stats in r.stats[1:]:
        want = sum(
            (h // BLOCK_SIZE * gemma_hybrid.full_layers + gemma_hybrid.swa_layers)
            * page
            for h in (replay_hit(A_LEN, BLOCK_SIZE), replay_hit(B_LEN, BLOCK_SIZE))
        )
        assert stats[LOAD_BYTES] == want


def test_gemma3_hybrid_two_blocks_per_chunk(runs, gemma_hybrid, record_property):
    """Offload chunks of two KV blocks (64 tokens): the worker's sub-block
    layout in a real engine; hits align to 64 tokens."""
    r = run(runs, gemma_hybrid, 0, blocks_per_chunk=2)
    ref = reference(runs, gemma_hybrid, 0)
    check_offload_run(r, ref, 2 * BLOCK_SIZE, record_property)
    want, _ = predicted_store(
        gemma_hybrid, [A, B], 0, 2 * BLOCK_SIZE, blocks_per_chunk=2
    )
    assert r.stats[0][STORE_BYTES] == want


def test_pure_swa_reloads_identically(runs, gemma_swa, record_property):
    """Sliding-window layers only: no full-attention alignment, the series
    aligns on the group's own chunk (32 tokens)."""
    for interval in (None, 0):
        r = run(runs, gemma_swa, interval)
        assert r.num_groups == 1
        ref = reference(runs, gemma_swa, interval)
        check_offload_run(r, ref, BLOCK_SIZE, record_property, f"_{interval}")
        want, _ = predicted_store(gemma_swa, [A, B], interval, BLOCK_SIZE)
        record_property(f"store_bytes_{interval}", r.stats[0][STORE_BYTES])
        assert r.stats[0][STORE_BYTES] == want


@pytest.mark.parametrize("interval", [None, 0, 512])
def test_mamba_hybrid_reloads_identically(runs, granite, interval, record_property):
    """GraniteMoeHybrid (2 Mamba2 + 2 attention, Mamba cache mode align): vLLM
    raises the block size so a Mamba state page matches an attention page."""
    r = run(runs, granite, interval)
    assert r.interval == interval
    assert r.num_groups == 2 and r.block_size % BLOCK_SIZE == 0
    ref = reference(runs, granite, interval)
    check_offload_run(r, ref, r.block_size, record_property)
    want = predicted_mamba_store(
        granite, [A, B], interval, r.block_size, MAMBA_STEP_TOKENS
    )
    record_property("block_size", r.block_size)
    record_property("store_bytes", r.stats[0][STORE_BYTES])
    assert r.stats[0][STORE_BYTES] == want


@pytest.mark.parametrize("model_name", ["gemma_hybrid", "granite"])
def test_negative_control_corrupted_loads_change_outputs(
    runs, request, model_name, record_property
):
    """The same run with a worker that writes zeros instead of the loaded
    blocks (Granite: Mamba states too): hits and loads happen, in the
    reference's shape, and the outputs no longer match it, by far more than
    the tolerance (also in bf16, where a shape change alone moved 0.047)."""
    model = request.getfixturevalue(model_name)
    r = run(runs, model, 0, host_copy_corrupt_loads=True)
    ref = reference(runs, model, 0)
    assert_same_shape(r, ref)
    assert_same_outputs(r.passes[0], ref.passes[0])  # pass 1 loads nothing
    loaded = r.passes[1] + r.passes[2]  # A, B, A + x, B + y
    want = ref.passes[1] + ref.passes[2]
    hits = [replay_hit(A_LEN, r.block_size), replay_hit(B_LEN, r.block_size)]
    assert [c.num_cached_tokens for c in loaded] == hits * 2
    assert r.stats[1][LOAD_BYTES] > 0
    changed = [c.token_ids != w.token_ids for c, w in zip(loaded, want)]
    # First tokens: same context in both runs, the gap is the corruption's.
    first_gap = max(abs(c.logprobs[0] - w.logprobs[0]) for c, w in zip(loaded, want))
    record_property("changed_prompts", sum(changed))
    record_property("first_logprob_gap", first_gap)
    record_property("first_gap_over_tolerance", first_gap / LOGPROB_ATOL)
    assert sum(changed) >= 3, changed
    # Far outside even a 1e-3 tolerance, not only outside this tight one.
    assert first_gap > 1e4 * LOGPROB_ATOL, first_gap


# -- item 2: sparse stores, by the predicted ratio -----------------------------


def test_store_bytes_follow_retention_interval(runs, gemma_hybrid, record_property):
    measured = {}
    for interval in (None, 0, 512):
        r = run(runs, gemma_hybrid, interval)
        measured[interval] = r.stats[0][STORE_BYTES]
        want, _ = predicted_store(gemma_hybrid, [A, B], interval, BLOCK_SIZE)
        assert measured[interval] == want, (interval, measured[interval], want)
    record_property("store_bytes", measured)
    dense = measured[None]
    for interval in (0, 512):
        predicted_ratio = (
            predicted_store(gemma_hybrid, [A, B], interval, BLOCK_SIZE)[0]
            / predicted_store(gemma_hybrid, [A, B], None, BLOCK_SIZE)[0]
        )
        record_property(
            f"ratio_{interval}", (measured[interval] / dense, predicted_ratio)
        )
        assert measured[interval] / dense == pytest.approx(predicted_ratio, rel=1e-9)
    assert measured[0] < measured[512] < dense


def test_mamba_store_bytes_follow_retention_interval(runs, granite, record_property):
    """Mamba states between retained boundaries are not stored: with prefill
    steps of 256 tokens the 1100-token prompt has states at 256, 512, 768 and
    1024; interval 0 keeps 1024 (the replay), interval 512 also 512."""
    measured = {i: run(runs, granite, i).stats[0][STORE_BYTES] for i in (None, 0, 512)}
    block = run(runs, granite, 0).block_size
    record_property("store_bytes", measured)
    assert mamba_state_positions(A_LEN, block, MAMBA_STEP_TOKENS, 512) == {512, 1024}
    for interval in (0, 512):
        predicted = predicted_mamba_store(
            granite, [A, B], interval, block, MAMBA_STEP_TOKENS
        )
        dense = predicted_mamba_store(granite, [A, B], None, block, MAMBA_STEP_TOKENS)
        assert measured[interval] / measured[None] == pytest.approx(
            predicted / dense, rel=1e-9
        )
    assert measured[0] < measured[512] < measured[None]


@pytest.mark.parametrize("interval", [None, 0, 512])
def test_skipped_counters_report_what_the_mask_dropped(runs, gemma_hybrid, interval):
    """Series metrics patch: vllm:kv_offload_retention_skipped_blocks / _bytes
    count the KV blocks (and their bytes, as store_bytes would have counted
    them) that retention kept out of the store: stored + skipped = dense."""
    r = run(runs, gemma_hybrid, interval)
    stats = r.stats[0]
    _, dropped = predicted_store(gemma_hybrid, [A, B], interval, BLOCK_SIZE)
    dense, _ = predicted_store(gemma_hybrid, [A, B], None, BLOCK_SIZE)
    if interval is None:
        assert stats.get(SKIPPED_BLOCKS, 0) == 0
        assert stats.get(SKIPPED_BYTES, 0) == 0
        return
    assert SKIPPED_BYTES in stats and SKIPPED_BLOCKS in stats, sorted(stats)
    assert stats[SKIPPED_BLOCKS] == dropped
    assert stats[SKIPPED_BYTES] == dense - stats[STORE_BYTES]


# -- item 3: bad intervals refuse to start ----------------------------------


def assert_nothing_left_running():
    assert psutil.Process().children(recursive=True) == []
    workers = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon
    ]
    assert workers == []


@pytest.mark.parametrize(
    "interval,blocks_per_chunk,chunk",
    [(48, 1, 32), (32, 2, 64)],  # 32 passes the GPU cache's block check
)
def test_interval_not_multiple_of_chunk_fails_startup(
    gemma_hybrid, interval, blocks_per_chunk, chunk
):
    kwargs = engine_kwargs(
        gemma_hybrid, interval=interval, blocks_per_chunk=blocks_per_chunk
    )
    with pytest.raises(ValueError) as err:
        with running_engine(**kwargs):
            pass
    message = str(err.value)
    assert f"--prefix-cache-retention-interval ({interval})" in message
    assert f"{chunk} tokens" in message
    assert_nothing_left_running()


def test_negative_interval_fails_startup(gemma_hybrid):
    kwargs = engine_kwargs(gemma_hybrid, interval=-32)
    with pytest.raises(ValueError) as err:
        with running_engine(**kwargs):
            pass
    # Refused while the engine config is built (the series names the flag,
    # not pydantic's field), before any engine process starts.
    assert "--prefix-cache-retention-interval (-32) must be non-negative" in str(
        err.value
    )
    assert_nothing_left_running()


# -- item 4: the deprecated environment variable -----------------------------


def test_env_interval_used_by_engine_without_flag(runs, gemma_hybrid, monkeypatch):
    monkeypatch.setenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "512")
    r = offload_run(gemma_hybrid, BATCHES[:1])  # interval left unset
    assert r.interval == 512
    assert r.stats[0][STORE_BYTES] == run(runs, gemma_hybrid, 512).stats[0][STORE_BYTES]


def _serve_engine_config(model, argv, monkeypatch, env):
    """The engine config `vllm serve MODEL ARGV...` would build (same parser,
    same AsyncEngineArgs.from_cli_args), without starting anything."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if env is None:
        monkeypatch.delenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", raising=False)
    else:
        monkeypatch.setenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", env)
    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers())
    args = parser.parse_args(
        ["serve", model.path, "--max-model-len", "2048", "--block-size", "32"]
        + ["--dtype", "float32", *argv]
    )
    args.model = args.model_tag
    engine_args = AsyncEngineArgs.from_cli_args(args)
    return engine_args.create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER
    )


@pytest.mark.parametrize(
    "env,argv,want",
    [
        ("512", [], 512),  # flag absent: the env var
        ("512", ["--prefix-cache-retention-interval", "0"], 0),  # flag wins
        (None, [], 0),  # neither: the default
        ("None", [], None),  # the env var accepts what the flag accepts
    ],
)
def test_serve_cli_resolves_env_interval(gemma_hybrid, monkeypatch, env, argv, want):
    config = _serve_engine_config(gemma_hybrid, argv, monkeypatch, env)
    assert config.cache_config.prefix_cache_retention_interval == want


def test_serve_cli_refuses_a_bad_env_interval(gemma_hybrid, monkeypatch):
    """A value the flag would refuse stops `vllm serve` with one line naming
    the variable and its value (it used to end in int()'s traceback)."""
    with pytest.raises(ValueError) as err:
        _serve_engine_config(gemma_hybrid, [], monkeypatch, "dense")
    assert str(err.value).startswith(
        "VLLM_PREFIX_CACHE_RETENTION_INTERVAL='dense' is not a valid"
    )
