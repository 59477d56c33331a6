# SPDX-License-Identifier: Apache-2.0
"""The arbiter: at the same retention interval, the sparse offload stores
serve at least what vLLM's own GPU prefix cache serves, at every sharing
length, wherever storing every chunk could serve it.

Request A (a prompt) is cached by a KVCacheManager built as vLLM's
tests/v1/core/test_prefix_caching.py builds one, and stored through the real
OffloadingConnectorScheduler (bench/offload_sim.py), once with the retention
rule and once with every chunk. A request sharing A's first s tokens (s on
every chunk edge) is then looked up in the GPU prefix cache without allocating
(get_computed_blocks) and in each offload tier after the GPU prefix cache is
reset. Unlike test_store_lookup_properties, which lists the GPU cache's
retained boundaries by hand, the lengths that matter here come from vLLM's
GPU cache itself.

The bar is min(GPU hit, every-chunk hit): where the GPU serves more than even
every chunk stored can (it hits in blocks, the offload lookup in chunks, and
EAGLE drops one of each), the store rule is not what limits the offload tier.

Geometries: test_store_lookup_properties' draws (full attention, MLA, sliding
window, chunked-local attention; EAGLE on no group, on the sliding-window
group or on every group; intervals None, 0 and k) except:
- a positive interval without a sliding-window group: vLLM refuses it;
- chunked-local attention only: vLLM's GPU cache "hits" earlier attention
  chunks without any cached data (nothing attends across them).

test_shared_prefix_junction_serves_what_the_gpu_cache_serves adds a second
request: B shares a prefix with A where the GPU cache's sliding-window group
kept no tail, so B pins the shared-prefix junction; a third request C sharing
B's first s tokens is then looked up in the GPU cache of the same scheduler
(run at the interval, as an engine runs it) and in the offload tier;
test_drawn_junctions_serve_what_the_gpu_cache_serves does the same over the
drawn geometries, B sharing a drawn part of A.

test_mamba_offload_tier_serves_what_the_gpu_cache_serves draws hybrid Mamba
geometries (full attention, a Mamba group cached in "align" mode, with or
without prefill checkpoints, or in "all" mode where the tree has it, a
sliding window beside them or not, EAGLE or not). Where Mamba states exist
depends on how vLLM's scheduler splits the prefill, so the GPU hits come
from the scheduler that ran A (bench/offload_sim.py), not from a
KVCacheManager allocating A at once."""

import functools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from bench.offload_sim import (
    AS_ENGINE,
    EVERY_CHUNK,
    OffloadSim,
    full,
    groups,
    mamba,
    swa,
)
from test_store_lookup_properties import (
    PAIRS,
    cases,
    engine_refuses,
    make_spec,
    probe_lengths,
    prompt,
    sharing_request,
    simulate,
)

from tests.v1.core.test_prefix_caching import make_kv_cache_manager, make_request
from vllm.utils.hashing import sha256 as vllm_sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import KVCacheConfig


def gpu_hits(kv_cache_groups, retention, tokens: list[int], lengths) -> dict[int, int]:
    """GPU prefix-cache hits of requests sharing ``tokens[:s]``, after a
    request with ``tokens`` as its prompt was computed and freed."""
    init_none_hash(vllm_sha256)
    block = min(g.kv_cache_spec.block_size for g in kv_cache_groups)
    manager = make_kv_cache_manager(
        KVCacheConfig(
            num_blocks=2000, kv_cache_tensors=[], kv_cache_groups=kv_cache_groups
        ),
        max_model_len=4096,
        enable_caching=True,
        hash_block_size=block,
        retention_interval=retention,
        use_eagle=any(g.is_eagle_group for g in kv_cache_groups),
    )
    a = make_request("a", tokens, block, vllm_sha256)
    computed, num_computed, _ = manager.get_computed_blocks(a)
    assert manager.allocate_slots(a, len(tokens), num_computed, computed) is not None
    manager.free(a)
    hits = {}
    for s in lengths:
        b = make_request(f"b{s}", sharing_request(tokens, s), block, vllm_sha256)
        hits[s] = manager.get_computed_blocks(b)[1]
    return hits


def shortfalls(sparse: dict, gpu: dict, every: dict, lengths) -> dict:
    """Sharing lengths where the offload tier serves less than both vLLM's
    GPU prefix cache and every chunk stored: (offload, GPU, every chunk)."""
    return {
        s: (sparse[s], gpu[s], every[s])
        for s in lengths
        if sparse[s] < min(gpu[s], every[s])
    }


def only_chunked_local(case) -> bool:
    """A model of chunked-local attention only: vLLM's GPU cache then "hits"
    the attention chunks before the current one without any cached data
    (nothing attends across them), which no store can be measured by."""
    return all(kind == "chunked" for kind, _, _ in case["layout"])


def hits_by_sharing_length(case) -> tuple[dict, dict, dict]:
    """Offload hits with the sparse stores, with every chunk stored, and the
    hits of a GPU prefix cache at the offload tier's interval, at every chunk
    edge up to A's prompt (the engine's GPU cache runs at the case's
    gpu_retention)."""
    kv_groups = groups(
        *(make_spec(kind, b, arg) for kind, b, arg in case["layout"]),
        eagle=case["eagle"],
    )
    lengths = [s for s in probe_lengths(case) if s <= case["num_prompt"]]
    gpu = gpu_hits(kv_groups, case["retention"], prompt(case["num_prompt"]), lengths)
    sparse = simulate(case, case["retention"])[2]
    every = simulate(case, EVERY_CHUNK)[2]
    return (
        {s: sparse[s] for s in lengths},
        {s: every[s] for s in lengths},
        gpu,
    )


@settings(
    max_examples=int(os.environ.get("FORK_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    derandomize="FORK_PROPERTY_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(cases().filter(lambda c: not (engine_refuses(c) or only_chunked_local(c))))
def test_offload_tier_serves_what_the_gpu_cache_serves(case):
    sparse, every, gpu = hits_by_sharing_length(case)
    short = shortfalls(sparse, gpu, every, gpu)
    assert not short, f"sharing length: (offload, GPU, every chunk) hits {short}"


def pair_settings(default: int):
    return settings(
        max_examples=int(os.environ.get("FORK_PAIR_EXAMPLES", str(default))),
        deadline=None,
        derandomize="FORK_PAIR_EXAMPLES" not in os.environ,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: "gpu=%s-offload=%s" % p)
def test_offload_tier_at_its_own_interval_serves_what_the_gpu_cache_serves(pair):
    """The offload tier at its own interval (the connector's
    "retention_interval") serves what vLLM's GPU prefix cache serves at that
    interval, whatever the engine's GPU cache runs at: every (GPU, offload)
    pair of interval kinds."""

    @pair_settings(6)
    @given(
        cases(pair).filter(lambda c: not (engine_refuses(c) or only_chunked_local(c)))
    )
    def check(case):
        sparse, every, gpu = hits_by_sharing_length(case)
        short = shortfalls(sparse, gpu, every, gpu)
        assert not short, f"(offload, GPU, every chunk) hits {short}"

    check()


@pytest.mark.parametrize("retention", [None, 0, 32])
def test_eagle_on_every_group_serves_what_the_gpu_cache_serves(retention):
    """Issue 22's probe: full attention (block 16) and a sliding window of 8
    (block 4), EAGLE on both, a 101-token prompt. At interval 32 the GPU
    cache serves 32 tokens to a request sharing 48-60 and 64 to one sharing
    80-92, where the offload tier served 16 and 48 (its store kept only the
    tails of requests sharing a boundary exactly, which the EAGLE drop puts
    one block lower). At interval 0 the GPU cache replayed nothing before
    vLLM's EAGLE replay fix was carried (patch 7); it serves 80 now."""
    case = dict(
        layout=[("full", 16, None), ("swa", 4, 8)],
        eagle=(0, 1),
        blocks_per_chunk=1,
        chunks=[16, 4],
        align=16,
        peek=4,
        retention=retention,
        gpu_retention=retention,
        num_prompt=101,
        offload_prompt_only=True,
        async_scheduling=False,
    )
    sparse, every, gpu = hits_by_sharing_length(case)
    assert gpu[100] == 80
    short = shortfalls(sparse, gpu, every, gpu)
    assert not short
    if retention == 32:
        assert [sparse[s] for s in (48, 60, 80, 92)] == [32, 32, 64, 64]


def junction_hits(
    kv_groups, stores, retention, a, b, lengths, **options
) -> tuple[dict, dict, int]:
    """C's GPU hits (A and B cached) and offload hits (what A and B stored,
    GPU reset) at each sharing length with B; and B's junction. ``stores``:
    the store setting (the interval, or EVERY_CHUNK); the GPU cache runs at
    ``retention`` either way. A group flagged EAGLE runs an EAGLE drafter.
    ``options``: OffloadSim's (blocks_per_chunk, ...)."""
    sim = OffloadSim(
        kv_groups,
        stores,
        gpu_retention=retention,
        eagle_drafter=any(g.is_eagle_group for g in kv_groups),
        **options,
    )
    sim.run(a)
    junction = sim.gpu_lookup(b)[1]
    sim.run(b)
    requests = {s: sharing_request(b, s) for s in lengths}
    gpu = {s: sim.gpu_lookup(c)[0] for s, c in requests.items()}
    stored = set(sim.stored)
    return gpu, {s: sim.probe_hit(c, stored) for s, c in requests.items()}, junction


@pytest.mark.parametrize(
    "eagle", [(), (1,), (0, 1)], ids=["", "eagle-swa", "eagle-all"]
)
@pytest.mark.parametrize("retention", [None, 0, 32])
def test_shared_prefix_junction_serves_what_the_gpu_cache_serves(retention, eagle):
    """Full attention 16 + sliding window 8 / block 4, A a 101-token prompt,
    B sharing 36 / 52 / 84 of A's tokens. At 0 and 32 the GPU cache kept no
    sliding-window tail where B leaves A, so B pins a junction there; C
    shares any part of B. Also with an EAGLE drafter on the sliding-window
    group and on both groups, where the GPU cache retains the position one
    block below the junction too."""
    kv_groups = groups(full(16), swa(4, 8), eagle=eagle)
    a = prompt(101)
    junctions = []
    for shared in (36, 52, 84):
        b = sharing_request(a, shared)
        lengths = range(4, len(b), 4)
        gpu, sparse, junction = junction_hits(
            kv_groups, retention, retention, a, b, lengths
        )
        every = junction_hits(kv_groups, EVERY_CHUNK, retention, a, b, lengths)[1]
        junctions.append(junction)
        short = shortfalls(sparse, gpu, every, lengths)
        assert not short, f"B shares {shared}: (offload, GPU, every chunk) {short}"
    # A sparse GPU cache leaves junctions to serve; a dense one never does.
    assert any(junctions) == (retention is not None), junctions


@pytest.mark.parametrize("with_full_attention", [False, True])
@pytest.mark.parametrize("retention", [None, 0, 48])
def test_follow_up_turn_finds_the_tail_before_its_peek_chunk(
    retention, with_full_attention
):
    """EAGLE on a sliding window of 1 (block 8) offloaded in 24-token chunks,
    alone or beside full attention (block 8). A stores its 32-token prompt:
    chunk 0. B, a follow-up turn extending it, hits the GPU cache for chunk
    0 and stores chunk 1. C shares 48 of B's tokens: its lookup matches
    chunk 0 and the peek chunk 1, and hits 24 with every chunk stored (the
    GPU cache serves 40). A kept no tail for that hit, whose peek chunk lay
    past its prompt, and served 0 (FORK_PROPERTY_EXAMPLES=400 found it)."""
    specs = [full(8), swa(8, 1)] if with_full_attention else [swa(8, 1)]
    kv_groups = groups(*specs, eagle=tuple(range(len(specs))))
    a = prompt(32)
    b = sharing_request(a, 32)
    lengths = range(8, len(b) + 1, 8)
    gpu, sparse, _ = junction_hits(
        kv_groups, retention, retention, a, b, lengths, blocks_per_chunk=3
    )
    every = junction_hits(
        kv_groups, EVERY_CHUNK, retention, a, b, lengths, blocks_per_chunk=3
    )[1]
    assert every[48] == 24
    short = shortfalls(sparse, gpu, every, lengths)
    assert not short, f"(offload, GPU, every chunk) hits {short}"


@settings(
    max_examples=int(os.environ.get("FORK_PROPERTY_EXAMPLES", "30")),
    deadline=None,
    derandomize="FORK_PROPERTY_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    cases().filter(lambda c: not (engine_refuses(c) or only_chunked_local(c))),
    st.floats(0, 1),
)
def test_drawn_junctions_serve_what_the_gpu_cache_serves(case, where):
    """test_shared_prefix_junction_serves_what_the_gpu_cache_serves over the
    drawn geometries: B shares a drawn part of A (``where`` of its prompt)."""
    kv_groups = groups(
        *(make_spec(kind, b, arg) for kind, b, arg in case["layout"]),
        eagle=case["eagle"],
    )
    a = prompt(case["num_prompt"])
    b = sharing_request(a, round(where * case["num_prompt"]))
    # Every chunk edge of any group up to B's end.
    lengths = sorted(
        {e for c in case["chunks"] for e in range(c, len(b) + 1, c)} | {len(b)}
    )
    options = dict(
        blocks_per_chunk=case["blocks_per_chunk"],
        offload_prompt_only=case["offload_prompt_only"],
        async_scheduling=case["async_scheduling"],
    )
    retention = case["retention"]
    gpu, sparse, _ = junction_hits(
        kv_groups, retention, retention, a, b, lengths, **options
    )
    _, every, _ = junction_hits(
        kv_groups, EVERY_CHUNK, retention, a, b, lengths, **options
    )
    short = shortfalls(sparse, gpu, every, lengths)
    assert not short, f"(offload, GPU, every chunk) hits {short}"


@functools.cache
def mamba_cache_modes() -> tuple[str, ...]:
    """The Mamba cache modes this tree's GPU prefix cache takes: vLLM 0.33.0
    caches Mamba prefixes in "align" mode only (MambaManager asserts it)."""
    config = KVCacheConfig(
        num_blocks=16,
        kv_cache_tensors=[],
        kv_cache_groups=groups(full(8), mamba(8, "all")),
    )
    try:
        make_kv_cache_manager(
            config, max_model_len=64, enable_caching=True, hash_block_size=8
        )
    except AssertionError:
        return ("align",)
    return ("align", "all")


@st.composite
def mamba_cases(draw, pair: tuple | None = None):
    """A drawn hybrid Mamba geometry; ``retention`` is the engine's interval
    and ``offload`` the offload tier's (the same unless ``pair`` gives the
    kinds of both)."""
    block = draw(st.sampled_from([8, 16]))
    mode = draw(st.sampled_from(mamba_cache_modes()))
    blocks_per_chunk = draw(st.sampled_from([1, 1, 2]))
    chunk = block * blocks_per_chunk
    retention = draw(st.sampled_from([None, 0, 1, 2]))
    retention = retention * chunk if retention else retention
    offload = retention
    if pair is not None:
        k = draw(st.sampled_from([1, 2])) * chunk
        retention, offload = (k if kind == "k" else kind for kind in pair)
    return dict(
        block=block,
        mode=mode,
        checkpoints=draw(st.sampled_from([0, 2])) if mode == "align" else 0,
        window=draw(st.none() | st.integers(1, 48)),
        eagle=draw(st.booleans()),
        blocks_per_chunk=blocks_per_chunk,
        retention=retention,
        offload=offload,
        num_prompt=draw(st.integers(16, 150)),
    )


def mamba_hits(case, stores, offload=AS_ENGINE) -> tuple[dict, dict]:
    """GPU prefix-cache hits (the scheduler that ran A, at the case's
    interval) and offload hits of what A stored (``stores``: the interval,
    or EVERY_CHUNK; ``offload``: the offload tier's own interval) at every
    block edge up to A's prompt."""
    specs = [
        full(case["block"]),
        mamba(case["block"], case["mode"], case["checkpoints"]),
    ]
    if case["window"] is not None:
        specs.append(swa(case["block"], case["window"]))
    kv_groups = groups(*specs, eagle=tuple(range(len(specs))) if case["eagle"] else ())
    sim = OffloadSim(
        kv_groups,
        stores,
        blocks_per_chunk=case["blocks_per_chunk"],
        gpu_retention=case["retention"],
        eagle_drafter=case["eagle"],
        offload_retention=offload,
    )
    a = prompt(case["num_prompt"])
    sim.run(a)
    requests = {
        s: sharing_request(a, s)
        for s in range(case["block"], case["num_prompt"] + 1, case["block"])
    }
    gpu = {s: sim.gpu_lookup(b)[0] for s, b in requests.items()}
    stored = set(sim.stored)
    return gpu, {s: sim.probe_hit(b, stored) for s, b in requests.items()}


@settings(
    max_examples=int(os.environ.get("FORK_PROPERTY_EXAMPLES", "20")),
    deadline=None,
    derandomize="FORK_PROPERTY_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mamba_cases())
def test_mamba_offload_tier_serves_what_the_gpu_cache_serves(case):
    gpu, sparse = mamba_hits(case, case["retention"])
    every = mamba_hits(case, EVERY_CHUNK)[1]
    short = shortfalls(sparse, gpu, every, gpu)
    assert not short, f"sharing length: (offload, GPU, every chunk) hits {short}"
    if case["retention"] is None:
        assert sparse == every


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: "gpu=%s-offload=%s" % p)
def test_mamba_offload_tier_at_its_own_interval(pair):
    """The Mamba draws for every (GPU, offload) pair: the offload tier at
    its interval serves what a GPU prefix cache at that interval serves (a
    scheduler run at it), the engine's GPU cache at the other."""

    @pair_settings(3)
    @given(mamba_cases(pair))
    def check(case):
        at_offload = dict(case, retention=case["offload"])
        gpu = mamba_hits(at_offload, case["offload"])[0]
        sparse = mamba_hits(case, case["retention"], case["offload"])[1]
        every = mamba_hits(case, EVERY_CHUNK)[1]
        short = shortfalls(sparse, gpu, every, gpu)
        assert not short, f"(offload, GPU, every chunk) hits {short}"
        if case["offload"] is None:
            assert sparse == every

    check()
