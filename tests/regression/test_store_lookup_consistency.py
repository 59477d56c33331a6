# SPDX-License-Identifier: Apache-2.0
"""Sparse offload stores against the lookup that must use them.

(a) no lost hits: for every boundary the retention keeps (the replay boundary,
    each interval segment), a later request sharing that prefix gets the same
    external hit as with dense stores (interval None);
(b) no wasted stores: every stored sliding-window chunk is one such a lookup
    hits."""

import pytest
from bench.offload_sim import EVERY_CHUNK, OffloadSim, chunked_local, full, groups, swa

from vllm.v1.kv_offload.base import get_offload_group_idx as group_of

# (name, groups, alignment tokens)
GEOMETRIES = {
    # DeepSeek-V4-like: large full-attention block, small SWA block.
    "full16+swa4w8": (lambda: groups(full(16), swa(4, 8)), 16),
    # gpt-oss-like: same block size, window of two blocks.
    "full16+swa16w32": (lambda: groups(full(16), swa(16, 32)), 16),
    # (window - 1) % chunk == 0: the GPU cache needs cdiv(8, 4) = 2 blocks
    # before an aligned hit, the offload lookup cdiv(9, 4) = 3 chunks.
    "full16+swa4w9": (lambda: groups(full(16), swa(4, 9)), 16),
}


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 7919 + i) % 997 + 3 for i in range(n)]


def retained_boundaries(num_prompt: int, align: int, retention: int) -> list[int]:
    """Hit boundaries a later request can reuse: the replay boundary (also
    the GPU prefix cache's) and, for a positive interval, each segment end
    below it."""
    replay = (num_prompt - 1) // align * align
    segments = range(retention, replay, retention) if retention else []
    return sorted({replay, *segments} - {0})


def hits_at(sim: OffloadSim, tokens: list[int], boundaries: list[int]) -> dict:
    """Hits of requests sharing each segment boundary, sharing all but the
    last prompt token (they reuse the GPU prefix cache's replay boundary),
    and of the replay itself."""
    stored = set(sim.stored)
    out = {}
    for b in [*boundaries[:-1], len(tokens) - 1]:
        request = tokens[:b] + prompt(40, seed=b)  # diverges after b
        out[b] = sim.probe_hit(request, stored)
    out["replay"] = sim.probe_hit(tokens, stored)
    return out


def extension_hit(sim: OffloadSim, stored: set, tokens: list[int], k: int) -> int:
    """A request extending the prompt hits the GPU prefix cache at 2k past
    it and stores full attention alone there; a request sharing the first
    multiple of k past the prompt falls back to the prompt's last SWA tail."""
    extended = tokens + prompt(3 * k, seed=99)
    cont = stored | sim.full_attention_keys(extended)
    s = (len(tokens) // k + 1) * k
    return sim.probe_hit(extended[:s] + prompt(40, seed=s), cont)


@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
@pytest.mark.parametrize("retention", [0, 32, 64])
@pytest.mark.parametrize("num_prompt", [64, 70, 130])
@pytest.mark.parametrize("offload_prompt_only", [True, False])
def test_sparse_stores_keep_hits_and_waste_nothing(
    geometry, retention, num_prompt, offload_prompt_only
):
    make_groups, align = GEOMETRIES[geometry]
    tokens = prompt(num_prompt)
    boundaries = retained_boundaries(num_prompt, align, retention)

    dense = OffloadSim(make_groups(), None, offload_prompt_only)
    dense.run(tokens)
    dense_stored = set(dense.stored)
    sparse = OffloadSim(make_groups(), retention, offload_prompt_only)
    sparse.run(tokens)
    sparse_stored = set(sparse.stored)  # B requests below store their own

    dense_hits = hits_at(dense, tokens, boundaries)
    sparse_hits = hits_at(sparse, tokens, boundaries)
    # Prompt-only: the GPU prefix cache holds the output past the stores.
    if retention and offload_prompt_only:
        dense_hits["extension"] = extension_hit(dense, dense_stored, tokens, retention)
        sparse_hits["extension"] = extension_hit(
            sparse, sparse_stored, tokens, retention
        )
    # (a) every retained boundary hits as with dense stores, and the hit is real.
    assert sparse_hits == dense_hits
    assert all(hit > 0 for hit in sparse_hits.values())
    # (b) every stored sliding-window chunk served one of those hits.
    unused = {k for k in sparse_stored - sparse.looked_up_hits if group_of(k) == 1}
    assert not unused, f"{len(unused)} stored SWA chunks no retained hit uses"
    # Sparse never stores more, and full attention is untouched.
    assert sparse_stored <= dense_stored
    assert {k for k in sparse_stored if group_of(k) == 0} == {
        k for k in dense_stored if group_of(k) == 0
    }


@pytest.mark.parametrize("retention", [0, 32])
def test_max_offload_tokens_cap_is_a_boundary(retention):
    """A request capped by max_offload_tokens stores full attention up to the
    cap; the cap must keep its sliding-window tail too, or those stores can
    never produce a hit (interval 0 would store no SWA chunk at all)."""
    tokens = prompt(64)
    params = {"max_offload_tokens": 40}
    hits = {}
    for name, interval in (("dense", None), ("sparse", retention)):
        sim = OffloadSim(groups(full(16), swa(4, 8)), interval)
        sim.run(tokens, kv_transfer_params=params)
        assert any(group_of(k) == 1 for k in sim.stored)
        hits[name] = sim.replay_hit(tokens[:40] + prompt(30, seed=1))
    assert hits["sparse"] == hits["dense"] == 32


@pytest.mark.parametrize(
    ("eagle", "replay_hit", "stored_swa"),
    [
        # MTP draft layer in the sliding-window group: the lookup matches the
        # window (2 chunks) before the hit plus one peek chunk after it, and
        # the hit need not sit on the full-attention alignment: 60 tokens.
        # Interval 0 keeps the chunks of the hits 60 (the replay), 48 and 44
        # (the GPU prefix cache's replay boundary 48, shared with and without
        # the peek): chunks 9..15.
        ((1,), 60, 7),
        # Every group drafts: the full-attention peek caps the hit at 48; the
        # boundary 48 shared exactly hits 32 (as the GPU prefix cache serves a
        # request sharing 48-60), and a follow-up turn that shares the whole
        # prompt and stores the peek chunk past it hits 64: chunks 6..8,
        # 10..12 and 14..15.
        ((0, 1), 48, 8),
    ],
)
@pytest.mark.parametrize("retention", [None, 0, 32])
def test_eagle_replay_keeps_the_peek_chunk(eagle, replay_hit, stored_swa, retention):
    """A 64-token replay on full attention block 16 + sliding window 8 / block
    4 hits as much as with every chunk stored (a direct port hits 48 instead
    of 60 with an EAGLE sliding-window group: the peek chunk is not stored)."""
    tokens = prompt(64)
    hits = {}
    stored = {}
    for name, setting in (("every", EVERY_CHUNK), ("sparse", retention)):
        sim = OffloadSim(groups(full(16), swa(4, 8), eagle=eagle), setting)
        sim.run(tokens)
        stored[name] = {k for k in sim.stored if group_of(k) == 1}
        hits[name] = sim.replay_hit(tokens)
    assert hits["sparse"] == hits["every"] == replay_hit
    assert len(stored["every"]) == 16
    if retention == 0:
        # Only the tails of the replay and the GPU replay boundary.
        assert len(stored["sparse"]) == stored_swa


def shared_prefix_hits(make_groups, setting, tokens, shares) -> tuple[list, set]:
    """Store ``tokens``; hits of requests sharing each of ``shares`` tokens
    (then diverging), each against exactly what ``tokens`` stored."""
    sim = OffloadSim(make_groups(), setting)
    sim.run(tokens)
    stored = set(sim.stored)
    return [
        sim.probe_hit(tokens[:s] + prompt(40, seed=1000 + s), stored) for s in shares
    ], stored


@pytest.mark.parametrize(
    ("make_groups", "num_prompt", "shares", "want"),
    [
        # EAGLE on the sliding-window group: a request sharing exactly a
        # 16-token boundary cannot match the chunk past it and falls back one
        # chunk (0.29.0 stock hits the same; the fork before this fix hit 0,
        # 16, ..., 80).
        (
            lambda: groups(full(16), swa(4, 8), eagle=(1,)),
            101,
            [16, 32, 48, 64, 80, 96],
            [12, 28, 44, 60, 76, 92],
        ),
        # Full attention 32 + sliding window 17 / block 8 (was 0 and 0).
        (lambda: groups(full(32), swa(8, 17), eagle=(1,)), 101, [32, 36], [24, 24]),
        # Three groups, EAGLE on the last.
        (
            lambda: groups(full(16), swa(8, 16), swa(4, 8), eagle=(2,)),
            101,
            [16, 32, 48, 64, 80, 96],
            [12, 28, 44, 60, 76, 92],
        ),
    ],
)
def test_none_hits_as_every_chunk_with_eagle(make_groups, num_prompt, shares, want):
    """Retention None promises every prefix the hit of storing every chunk
    (and so never less than stock)."""
    tokens = prompt(num_prompt)
    every, _ = shared_prefix_hits(make_groups, EVERY_CHUNK, tokens, shares)
    dense, _ = shared_prefix_hits(make_groups, None, tokens, shares)
    assert every == want
    assert dense == want


@pytest.mark.parametrize("num_prompt", [64, 96, 112, 128, 256, 512])
@pytest.mark.parametrize("retention", [0, 32])
def test_gpu_replay_boundary_is_kept(num_prompt, retention):
    """A request sharing P - 1 tokens of a prompt whose length P is a multiple
    of the full-attention chunk reuses the GPU prefix cache's replay boundary
    P - 16: the offload tier must serve it too (it hit 0 at interval 0)."""
    make = lambda: groups(full(16), swa(4, 8))  # noqa: E731
    tokens = prompt(num_prompt)
    shares = [num_prompt - 1]
    every, _ = shared_prefix_hits(make, EVERY_CHUNK, tokens, shares)
    sparse, stored = shared_prefix_hits(make, retention, tokens, shares)
    assert every == sparse == [num_prompt - 16]
    # The price: one window (2 chunks) beyond the replay's own tail.
    if retention == 0:
        assert len({k for k in stored if group_of(k) == 1}) == 4


@pytest.mark.parametrize("retention", [None, 0])
def test_chunked_local_attention_stays_dense(retention):
    """vLLM caches chunked-local attention (Llama 4) densely whatever the
    interval; so must the offload stores (interval 0 stored 20 of 32 keys and
    requests sharing 50 / 36 tokens hit 0 / 0). A positive interval is
    refused for this model (no sliding-window group): no engine runs it."""
    make = lambda: groups(full(4), chunked_local(4, 16))  # noqa: E731
    tokens = prompt(64)
    every, every_stored = shared_prefix_hits(make, EVERY_CHUNK, tokens, [50, 36])
    hits, stored = shared_prefix_hits(make, retention, tokens, [50, 36])
    assert every == hits == [48, 36]
    assert stored == every_stored and len(stored) == 32
