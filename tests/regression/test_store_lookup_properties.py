# SPDX-License-Identifier: Apache-2.0
"""Property search over random geometries: sparse stores against a reference
that stores every chunk, through the real OffloadingConnectorScheduler.

Request A is stored; then requests sharing its first s tokens (s on every
chunk edge of any group: between edges the lookup's answer cannot change)
are looked up against exactly what A stored. The reference answers the same
probes with every chunk of A stored (no mask at all), so the oracle does not
come from the code under test.

(a) no lost hits:
    - interval None: every probe hits exactly as the reference (and so never
      less than stock 0.29.0, whose stores are a subset of every chunk);
    - interval k >= 0: the replay hits as the reference, and a request
      sharing s tokens hits at least what the reference gives at every
      retained sharing length r <= s: the GPU prefix cache's replay boundary
      floor((P - 1) / A) * A, P - 1, each multiple of k, each shared exactly
      and with the EAGLE peek chunk (an EAGLE lookup that cannot match the
      chunk past a boundary falls back one chunk); and where the GPU cache
      retains a tail (vLLM's own reachable_boundaries, EAGLE landings
      included) and each multiple of k, shared as far as a request the GPU
      cache serves there (plus what its EAGLE groups match past it);
    - a request extending A that hits the GPU prefix cache past A's end
      stores only full attention there; requests sharing the retained
      boundaries past A's end (None, k > 0) hit as the reference (they fall
      back to A's last sliding-window tail);
    - a follow-up turn extending A that hits the GPU prefix cache up to A's
      last whole scheduler block stores every chunk past that hit: a request
      sharing it as far as A's end and the EAGLE peek
      chunk, or further, hits at least what the reference gives at that
      length (with None, as the reference at every length; with decode
      offloading and k >= 0 no floor: A's end is unknown when its last tails
      are stored);
(b) no wasted stores: every stored sliding-window chunk serves one of those
    required lookups, a follow-up turn's included (with decode offloading,
    at most one tail per group);
(c) sparse stores are a subset of the reference's; full attention and
    chunked-local attention (which vLLM caches densely) are untouched.

Group kinds drawn: full attention, MLA, sliding window (also MLA, and one
that keeps extra_retained_tokens of history for multi-token MTP), and
chunked-local attention. Mamba groups are drawn by the arbiter
(test_offload_vs_gpu_cache.test_mamba_offload_tier_serves_what_the_gpu_cache_serves),
whose GPU-side oracle comes from vLLM's scheduler: where a Mamba state exists
depends on how it splits the prefill, which no hand-listed boundary models."""

import os
from collections import Counter
from math import lcm
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from bench.offload_sim import EVERY_CHUNK, OffloadSim, chunked_local, full, groups, swa

from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID
import vllm.v1.core.kv_cache_coordinator as coordinator
from vllm.v1.kv_cache_interface import (
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.base import get_offload_group_idx as group_of

WINDOWED = ("swa", "swa_mla", "swa_mtp")  # the kinds sparse retention may thin


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 7919 + i) % 997 + 3 for i in range(n)]


def make_spec(kind: str, block: int, arg: int | None):
    common = dict(block_size=block, num_kv_heads=1, head_size=1, dtype=torch.float32)
    if kind == "full":
        return full(block)
    if kind == "mla":
        return MLAAttentionSpec(**common)
    if kind == "swa":
        return swa(block, arg)
    if kind == "swa_mla":
        return SlidingWindowMLASpec(**common, sliding_window=arg)
    if kind == "swa_mtp":
        # Multi-token MTP keeps 1-4 more tokens of history on the GPU, which
        # a load restores too.
        return SlidingWindowSpec(
            **common, sliding_window=arg, extra_retained_tokens=1 + arg % 4
        )
    assert kind == "chunked"
    return chunked_local(block, arg)


# Interval kinds of the GPU prefix cache and the offload tier: None, 0, or a
# multiple ("k") of the case's alignment and chunks.
INTERVAL_KINDS = (None, 0, "k")
PAIRS = [(gpu, offload) for gpu in INTERVAL_KINDS for offload in INTERVAL_KINDS]


@st.composite
def cases(draw, pair: tuple | None = None):
    """A drawn geometry and request. ``retention`` is the offload tier's
    interval and ``gpu_retention`` the GPU prefix cache's: the same one
    drawn from None / 0 / k unless ``pair`` gives their kinds."""
    blocks_per_chunk = draw(st.sampled_from([1, 1, 2, 3]))
    full_kind = draw(st.sampled_from([None, "full", "full", "mla"]))
    full_block = draw(st.sampled_from([8, 16]))
    kinds = [
        draw(st.sampled_from(["swa", "swa", "swa_mla", "swa_mtp", "chunked"]))
        for _ in range(draw(st.integers(1, 2)))
    ]
    # One block size for all groups where RequestRunner (blocks_per_chunk > 1)
    # or vLLM (chunked-local attention) needs it.
    uniform = blocks_per_chunk > 1 or "chunked" in kinds
    sizes = [full_block] if uniform else [4, 8, 16]
    layout = [(full_kind, full_block, None)] if full_kind else []
    for kind in kinds:
        block = draw(st.sampled_from(sizes))
        if kind == "chunked":
            arg = block * draw(st.integers(1, 4))
        else:
            arg = draw(st.integers(1, 48))
        layout.append((kind, block, arg))
    eagle_mode = draw(st.sampled_from(["none", "none", "swa", "all"]))
    if any(kind == "chunked" for kind, _, _ in layout):
        eagle_mode = "none"  # vLLM rejects EAGLE with chunked-local attention
    eagle = {
        "none": (),
        "swa": (len(layout) - 1,),
        "all": tuple(range(len(layout))),
    }[eagle_mode]
    chunks = [block * blocks_per_chunk for _, block, _ in layout]
    align = chunks[0] if full_kind else lcm(*chunks)
    retention = draw(st.sampled_from([None, 0, 1, 2]))
    if retention:
        retention *= lcm(align, *chunks)
    gpu_retention = retention
    if pair is not None:
        k = draw(st.sampled_from([1, 2])) * lcm(align, *chunks)
        gpu_retention, retention = (k if kind == "k" else kind for kind in pair)
    windowed_eagle = [chunks[i] for i in eagle if layout[i][0] in WINDOWED]
    return dict(
        layout=layout,
        eagle=eagle,
        blocks_per_chunk=blocks_per_chunk,
        chunks=chunks,
        align=align,
        peek=max(windowed_eagle, default=0),
        retention=retention,
        gpu_retention=gpu_retention,
        num_prompt=draw(st.integers(16, 150)),
        offload_prompt_only=draw(st.booleans()),
        async_scheduling=draw(st.booleans()),
    )


def stored_sequence(case) -> list[int]:
    tokens = prompt(case["num_prompt"])
    return tokens if case["offload_prompt_only"] else tokens + [EOS_TOKEN_ID]


def probe_lengths(case) -> list[int]:
    """Every chunk edge of any group up to the stored sequence's end."""
    end = len(stored_sequence(case))
    edges = {e for c in case["chunks"] for e in range(c, end + 1, c)}
    return sorted(edges | {case["num_prompt"] - 1, end})


def required_lengths(case) -> set[int]:
    """Sharing lengths whose reference hit the sparse stores must match."""
    num_prompt, retention = case["num_prompt"], case["retention"]
    end = len(stored_sequence(case))
    if retention is None:
        return set(probe_lengths(case))
    boundaries = {(num_prompt - 1) // case["align"] * case["align"], num_prompt - 1}
    segments = set(range(retention, end + 1, retention)) if retention else set()
    shared = {min(b + d, end) for b in boundaries | segments for d in (0, case["peek"])}
    # Where vLLM's GPU prefix cache retains this prompt's tails (and each
    # segment), shared as far as a request it serves there.
    gpu_align = lcm(*(block for _, block, _ in case["layout"]))
    positions, extent = gpu_replay_positions(case, gpu_align)
    positions = set(positions) | segments
    shared |= {min(p + extent, end) for p in positions}
    # A later request extending the prompt.
    return (shared | {num_prompt}) - {0}


def gpu_replay_positions(case, gpu_align: int) -> tuple[tuple[int, ...], int]:
    """Where vLLM's GPU prefix cache retains A's replay tails, and how far
    past such a position a request it serves there shares (EAGLE), from the
    tree's own core functions: the fork's reachable_boundaries and
    eagle_extent (patch 7), or replay_boundaries and eagle_proof_margin on
    vLLM >= 0.32.0."""
    eagle_blocks = [case["layout"][i][1] for i in case["eagle"]]
    if hasattr(coordinator, "reachable_boundaries"):
        extent = coordinator.eagle_extent(eagle_blocks, gpu_align)
        request = SimpleNamespace(
            num_prompt_tokens=case["num_prompt"], shared_prefix_boundary=0
        )
        return coordinator.reachable_boundaries(request, gpu_align, extent), extent
    from vllm.v1.core.kv_cache_utils import eagle_proof_margin

    positions = coordinator.replay_boundaries(
        case["num_prompt"], gpu_align, bool(eagle_blocks)
    )
    margin = max(
        (eagle_proof_margin(block, block, False) for block in eagle_blocks),
        default=0,
    )
    return positions, margin


def extension(case) -> list[int]:
    """A follow-up request: A's sequence and then some."""
    return stored_sequence(case) + prompt(200, seed=3000)


def extension_lengths(case) -> list[int]:
    """Retained boundaries past A's stored prompt (every aligned one with
    None, multiples of k; none with 0) that a request extending A can be
    shared at. Only prompt-only stores end before A's sequence does: the
    GPU prefix cache holds A's output, so the extending request can hit it
    past the stored end (here A's output is one token, but a prompt-only
    store is decided with the prompt alone, its length unknown)."""
    if case["gpu_retention"] == 0 or not case["offload_prompt_only"]:
        return []
    end = len(stored_sequence(case))
    segment = case["gpu_retention"] or case["align"]
    first = (end // segment + 1) * segment
    return [s for s in (first, first + segment) if s < len(extension(case))]


def follow_up_lengths(case) -> list[int]:
    """Sharing lengths of a follow-up turn (extension) from A's stored end
    and the EAGLE peek past it, as far as its hits can still fall back into
    A's chunks: that length, and every chunk edge of any group up to two of
    the largest chunks and the peek past A's end."""
    end = len(stored_sequence(case))
    last = end + 2 * max(case["chunks"]) + case["peek"]
    edges = {e for c in case["chunks"] for e in range(c, last + 1, c) if e > end}
    return sorted(edges | {end + case["peek"]})


def sharing_request(tokens: list[int], s: int) -> list[int]:
    """A request sharing the first s tokens, then its own."""
    return tokens[:s] + prompt(40, seed=1000 + s)


def probe(sim, stored, case, s: int) -> int:
    return sim.probe_hit(sharing_request(stored_sequence(case), s), stored)


def simulate(case, retention):
    """Store A and probe it: ``retention`` is EVERY_CHUNK (the reference) or
    the case's offload interval, run beside its GPU prefix-cache interval."""
    own_interval = {}
    if retention != EVERY_CHUNK:
        own_interval = {"offload_retention": retention}
        retention = case["gpu_retention"]
    sim = OffloadSim(
        groups(
            *(make_spec(kind, b, arg) for kind, b, arg in case["layout"]),
            eagle=case["eagle"],
        ),
        retention,
        case["offload_prompt_only"],
        case["blocks_per_chunk"],
        case["async_scheduling"],
        **own_interval,
    )
    tokens = prompt(case["num_prompt"])
    sim.run(tokens)
    stored = set(sim.stored)
    replay = sim.probe_hit(tokens, stored)
    required = sorted(required_lengths(case))
    hits = {s: probe(sim, stored, case, s) for s in required}
    # A request extending A that hits the GPU prefix cache past A's end
    # stores full attention there, not the windows: a request sharing a
    # retained boundary in between falls back to A's last tail (retention 0
    # retains no boundary past the prompt).
    for s in extension_lengths(case):
        extended = extension(case)
        cont = stored | sim.full_attention_keys(extended)
        hits[s] = sim.probe_hit(extended[:s] + prompt(40, seed=2000 + s), cont)
    # A follow-up turn hits the GPU prefix cache at most as far as A's last
    # whole scheduler block (the LCM of the groups' blocks), computes the
    # rest and stores every chunk past that hit: requests sharing it hit A's
    # tails before those chunks, an EAGLE lookup's peek chunk past A's end
    # included.
    extended = extension(case)
    gpu_block = lcm(*(block for _, block, _ in case["layout"]))
    gpu_hit = tokens[: case["num_prompt"] // gpu_block * gpu_block]
    cont = stored | (
        sim.every_chunk_keys(extended)
        - (sim.every_chunk_keys(gpu_hit) if gpu_hit else set())
    )
    follow_up = {
        s: sim.probe_hit(extended[:s] + prompt(40, seed=4000 + s), cont)
        for s in follow_up_lengths(case)
    }
    # Which of A's chunks the required lookups used, before any other probe.
    used = sim.looked_up_hits & stored
    for s in probe_lengths(case):
        if s not in hits:
            hits[s] = probe(sim, stored, case, s)
    return stored, replay, hits, follow_up, used


def engine_refuses(case) -> bool:
    """vLLM refuses a positive interval for a model without a sliding-window
    group (nothing for it to thin): no engine runs such a case."""
    return bool(case["retention"] or case["gpu_retention"]) and not any(
        kind in WINDOWED for kind, _, _ in case["layout"]
    )


@settings(
    max_examples=int(os.environ.get("FORK_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    derandomize="FORK_PROPERTY_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(cases().filter(lambda c: not engine_refuses(c)))
def test_sparse_stores_match_every_chunk_stores(case):
    check_against_every_chunk(case)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: "gpu=%s-offload=%s" % p)
def test_offload_interval_apart_from_the_gpu_cache(pair):
    """The same properties at the offload tier's own interval, for every
    (GPU prefix cache, offload tier) pair of interval kinds."""

    @settings(
        max_examples=int(os.environ.get("FORK_PAIR_EXAMPLES", "8")),
        deadline=None,
        derandomize="FORK_PAIR_EXAMPLES" not in os.environ,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(cases(pair).filter(lambda c: not engine_refuses(c)))
    def check(case):
        check_against_every_chunk(case)

    check()


def check_against_every_chunk(case):
    every_stored, every_replay, every_hits, every_follow_up, _ = simulate(
        case, EVERY_CHUNK
    )
    stored, replay, hits, follow_up, used = simulate(case, case["retention"])
    # (a) no lost hits.
    assert replay == every_replay
    # A follow-up turn sharing A's end and the EAGLE peek past it, or more,
    # hits at least as the reference does there; with None, as the reference
    # at every length. With decode offloading a running request cannot know
    # its end when it stores the last tails: only None keeps them (every
    # chunk edge is a hit then).
    first = len(stored_sequence(case)) + case["peek"]
    for s, hit in follow_up.items():
        floor = every_follow_up[s]
        if case["retention"] is not None:
            floor = 0
            if case["offload_prompt_only"] and s >= first:
                floor = every_follow_up[first]
        assert every_follow_up[s] >= hit >= floor, ("follow-up", s, hit, floor)
    if case["retention"] is None:
        assert hits == every_hits
    else:
        required = sorted(required_lengths(case))
        for s, hit in sorted(hits.items()):
            floor = max((every_hits[r] for r in required if r <= s), default=0)
            # The reference is not monotonic everywhere (chunked-local
            # attention: sharing 15 of 16 tokens may hit 0 where sharing 8
            # hits 8); then the sparse stores must give the reference's hit.
            floor = min(floor, every_hits[s])
            assert every_hits[s] >= hit >= floor, (s, hit, floor, every_hits[s])
        for s in extension_lengths(case):
            assert hits[s] == every_hits[s], ("extension", s)
    # (b) every stored sliding-window chunk served a required lookup. With
    # decode tokens offloaded too (offload_prompt_only off) a store cannot
    # know where the request will stop: at most the tail of one boundary the
    # request stopped short of may be stored per group.
    windowed = {i for i, (kind, _, _) in enumerate(case["layout"]) if kind in WINDOWED}
    unused = Counter(group_of(k) for k in stored - used if group_of(k) in windowed)
    if case["offload_prompt_only"]:
        assert not unused, f"stored sliding-window chunks never hit: {unused}"
    else:
        for group, count in unused.items():
            _, block, window = case["layout"][group]
            tail = -(-window // (block * case["blocks_per_chunk"])) + 1
            assert count <= tail, f"group {group}: {count} unused chunks"
    # (c) sparse never stores more; dense kinds are untouched.
    assert stored <= every_stored
    assert {k for k in stored if group_of(k) not in windowed} == {
        k for k in every_stored if group_of(k) not in windowed
    }
