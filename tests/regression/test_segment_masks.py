# SPDX-License-Identifier: Apache-2.0
"""The core's sparse masks against the segment rule stated block by block.

retained_segment_boundaries() (upstream-pr/0004, patch 12) is the one place
that says which segment boundaries sparse retention keeps; the sliding-window
and Mamba masks build their segment tails from it. Here the rule is stated a
second, independent way, per block, as #51886 wrote it: a sliding-window
block i is kept when (i - shift) % per_segment >= per_segment - need (the
need-block tail ending on each boundary, shifted one block under EAGLE), a
Mamba block when it ends on a boundary; plus the tails of the reachable
boundaries. Random geometries, intervals, block ranges and boundaries."""

import random

import pytest
import torch

from vllm.v1.core.single_type_kv_cache_manager import (
    MambaManager,
    SlidingWindowManager,
)
from vllm.v1.kv_cache_interface import MambaSpec, SlidingWindowSpec


def swa_rule(start, end, alignment, block, need, shift, interval, boundaries):
    segment = alignment if interval is None else interval
    mask = [False] * (end - start)
    if segment:
        per_segment = segment // block
        if need >= per_segment:
            return None
        for i in range(start, end):
            if i >= shift and (i - shift) % per_segment >= per_segment - need:
                mask[i - start] = True
    if interval is not None:
        for b in boundaries:
            tail_end = b // alignment * alignment // block + shift
            for j in range(max(start, tail_end - need), min(end, tail_end)):
                mask[j - start] = True
    return mask


def mamba_rule(start, end, alignment, block, interval, boundaries):
    if interval is None:
        return None
    mask = [False] * (end - start)
    if interval:
        per_segment = interval // block
        if per_segment <= 1:
            return None
        for i in range(start, end):
            if (i + 1) % per_segment == 0:
                mask[i - start] = True
    for b in boundaries:
        i = b // alignment * alignment // block - 1
        if start <= i < end:
            mask[i - start] = True
    return mask


@pytest.mark.parametrize("seed", range(4))
def test_masks_follow_the_segment_rule(seed):
    rng = random.Random(seed)
    for _ in range(1000):
        block = rng.choice([1, 2, 4, 8, 16])
        window = rng.randint(1, 40)
        eagle = rng.random() < 0.5
        alignment = block * rng.choice([1, 2, 3, 4, 8])
        interval = rng.choice(
            [None, 0, alignment, 2 * alignment, 3 * alignment, 5 * alignment]
        )
        start = rng.randint(0, 30)
        end = start + rng.randint(0, 40)
        boundaries = sorted(rng.sample(range(1, 400), rng.randint(0, 3)))
        case = (block, window, eagle, alignment, interval, start, end, boundaries)
        swa = SlidingWindowSpec(
            block_size=block,
            num_kv_heads=1,
            head_size=8,
            dtype=torch.float16,
            sliding_window=window,
        )
        need = SlidingWindowManager._contiguous_blocks_for_hit(
            window_size=window, block_size=block, use_eagle=eagle
        )
        got = SlidingWindowManager.reachable_block_mask(
            start, end, alignment, swa, eagle, interval, boundaries
        )
        want = swa_rule(
            start, end, alignment, block, need, int(eagle), interval, boundaries
        )
        assert got == want, case
        mamba = MambaSpec(block_size=block, shapes=((1,),), dtypes=(torch.float16,))
        got = MambaManager.reachable_block_mask(
            start, end, alignment, mamba, False, interval, boundaries
        )
        assert got == mamba_rule(start, end, alignment, block, interval, boundaries), (
            case
        )
