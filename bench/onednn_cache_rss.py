# SPDX-License-Identifier: Apache-2.0
"""Resident memory of vLLM's fp32 CPU GEMMs (oneDNN, as the worker runs them)
against the number of distinct token counts M they have been called with:
the tiny Gemma's linear layers (bench/soak.py's model: 4 layers of qkv, o,
gate_up and down, plus the head). oneDNN caches a primitive per shape and M
(ONEDNN_PRIMITIVE_CACHE_CAPACITY, default 1,024), on top of vLLM's own
per-layer caches; this shows what that costs and that it stops growing with
the cache off.

    python -m bench.onednn_cache_rss [--counts 1000]
    ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 python -m bench.onednn_cache_rss

Prints MiB above the start, every 100 distinct token counts."""

import argparse
import os
import random

import psutil
import torch

from vllm import _custom_ops as ops

HIDDEN, INTERMEDIATE, VOCAB, HEAD_DIM, HEADS, KV_HEADS = 128, 256, 512, 64, 2, 1
LAYERS = 4
MAX_TOKENS = 2048  # the soak's max_num_batched_tokens: M ranges over 1..this


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", type=int, default=1000, help="distinct M values")
    args = ap.parse_args()
    torch.manual_seed(0)
    shapes = [
        (HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
        (HEADS * HEAD_DIM, HIDDEN),
        (HIDDEN, 2 * INTERMEDIATE),
        (INTERMEDIATE, HIDDEN),
    ] * LAYERS + [(HIDDEN, VOCAB)]
    # vLLM's handler per layer, as dispatch_cpu_unquantized_gemm makes it.
    handlers = [(ops.create_onednn_mm(torch.randn(n, k).t(), 32), k) for k, n in shapes]
    token_counts = list(range(1, MAX_TOKENS + 1))
    random.Random(0).shuffle(token_counts)
    proc = psutil.Process()
    start = proc.memory_info().rss / 2**20
    points = []
    for i, m in enumerate(token_counts[: args.counts], 1):
        for handler, k in handlers:
            ops.onednn_mm(handler, torch.randn(m, k), None)
        if i % 100 == 0:
            points.append(f"{i}:{proc.memory_info().rss / 2**20 - start:+.0f}")
    capacity = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "default")
    print(f"ONEDNN_PRIMITIVE_CACHE_CAPACITY={capacity}: MiB after N token counts")
    print(" ".join(points))


if __name__ == "__main__":
    main()
