# SPDX-License-Identifier: Apache-2.0
"""Replay and shared-prefix hits of the sparse offload stores, per defect case.

Request A is stored through the real OffloadingConnectorScheduler (vLLM's
RequestRunner harness of the tree under test, a mocked offloading manager
answering from an in-memory set); then, one at a time and against exactly
what A stored, the GPU prefix cache is reset and a request B is looked up:
A's replay, or a request sharing A's first s tokens and then diverging. The
"every-chunk" column is the same tree with the store masks switched off
(every complete chunk stored): the reference a sparse store must match.

    PYTHONPATH=TREE python -m bench.replay_cases --tree TREE [--before TABLE]

TREE: a vLLM source tree with its tests/ (stock 0.32.0, 0.32.0 + upstream-pr/,
or 0.29.0 + patches/); TABLE: this script's output on another tree (e.g.
the stock base), shown as "before -> after" where a cell changed. Run from
the repository root (for the bench package)
with the tree's venv; VLLM_TARGET_DEVICE=cpu and an offline hub cache are
set here when unset (tests/fixtures/hf is served as the hub cache).
"""

import argparse
import contextlib
import inspect
import os
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]

EVERY_CHUNK = "every-chunk"
SETTINGS: tuple[int | None | str, ...] = (EVERY_CHUNK, None, 0, 32)
_SCHED = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 7919 + i) % 997 + 3 for i in range(n)]


# name -> (full-attention block, SWA block, window, EAGLE on the SWA group,
# prompt length, max_offload_tokens, probes). A probe is "replay" or the
# number of tokens B shares with A.
CASES: dict[str, tuple] = {
    "a: full16+swa4w9 P=64": (16, 4, 9, False, 64, None, ["replay", 63, 48, 32]),
    "a: full16+swa4w9 P=70": (16, 4, 9, False, 70, None, ["replay", 69, 48, 32]),
    "b: full16+swa4w8 EAGLE(swa) P=64": (
        16,
        4,
        8,
        True,
        64,
        None,
        ["replay", 63, 48],
    ),
    "c: full16+swa4w8 P=64 cap 40": (16, 4, 8, False, 64, 40, ["replay", 40]),
    "f3: full16+swa4w8 EAGLE(swa) P=101": (
        16,
        4,
        8,
        True,
        101,
        None,
        [16, 32, 48, 64, 80, 96],
    ),
    "replay: full16+swa4w8 P=64": (16, 4, 8, False, 64, None, ["replay", 63]),
}


def _setup_env(tree: Path) -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    hf_home = ROOT / "build" / "hf-home"
    if "HF_HOME" not in os.environ and hf_home.is_dir():
        os.environ["HF_HOME"] = str(hf_home)
    sys.path.insert(0, str(tree))


class Sim:
    """One tree, one geometry, one retention setting."""

    def __init__(self, case: tuple, setting: int | None | str):
        import torch

        from tests.v1.kv_connector.unit.offloading_connector import utils
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheGroupSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.kv_offload.base import LookupResult

        full_block, swa_block, window, eagle, *_ = case
        common = dict(num_kv_heads=1, head_size=1, dtype=torch.float32)
        groups = [
            KVCacheGroupSpec(
                ["layer0"], FullAttentionSpec(block_size=full_block, **common)
            ),
            KVCacheGroupSpec(
                ["layer1"],
                SlidingWindowSpec(
                    block_size=swa_block, sliding_window=window, **common
                ),
                is_eagle_group=eagle,
            ),
        ]
        self.every_chunk = setting == EVERY_CHUNK
        retention = None if self.every_chunk else setting
        # The retention keyword of the tree's harness (0.32.0: retention_interval,
        # the 0.29.0 fork: prefix_cache_retention_interval).
        params = inspect.signature(utils.RequestRunner).parameters
        kwargs = {}
        for name in ("retention_interval", "prefix_cache_retention_interval"):
            if name in params:
                kwargs[name] = retention
                break
        else:
            if retention is not None:
                raise SystemExit(
                    "this tree's RequestRunner takes no retention interval"
                )
        with mock.patch(
            "vllm.transformers_utils.config.try_get_safetensors_metadata",
            return_value=None,
        ):
            self.runner = utils.RequestRunner(
                block_size=min(full_block, swa_block),
                num_gpu_blocks=2000,
                async_scheduling=False,
                kv_cache_groups=groups,
                extra_config_overrides={"offload_prompt_only": True},
                **kwargs,
            )
        self.stored: set = set()
        self.hits: list[int | None] = []
        manager = self.runner.manager

        def prepare_store(keys, req_context):
            keys = list(keys)
            self.stored.update(keys)
            return utils.generate_store_output(keys)

        manager.prepare_store.side_effect = prepare_store
        manager.prepare_load.side_effect = lambda keys, ctx: utils.MockLoadStoreSpec(
            keys
        )
        manager.lookup.side_effect = lambda key, ctx: (
            LookupResult.HIT if key in self.stored else LookupResult.MISS
        )
        connector = self.runner.connector_scheduler
        matched = connector.get_num_new_matched_tokens

        def record_hit(request, num_computed_tokens, **kwargs):
            result = matched(request, num_computed_tokens, **kwargs)
            self.hits.append(result[0])
            return result

        connector.get_num_new_matched_tokens = record_hit

    def _no_masks(self):
        """Switch the store masks off: every complete chunk is stored."""
        import importlib

        sched = importlib.import_module(_SCHED)
        if hasattr(sched, "reachable_chunk_mask"):
            return mock.patch(f"{_SCHED}.reachable_chunk_mask", return_value=None)
        # Stock 0.32.0: the masks come from one scheduler method.
        return mock.patch.object(
            sched.OffloadingConnectorScheduler,
            "_reachable_store_block_mask",
            return_value=None,
        )

    def run(self, token_ids: list[int], params: dict | None = None) -> int:
        from tests.v1.kv_connector.unit.utils import EOS_TOKEN_ID

        self.hits.clear()
        self.runner.new_request(token_ids=token_ids, kv_transfer_params=params)
        masks = self._no_masks() if self.every_chunk else contextlib.nullcontext()
        with masks:
            self.runner._run(decoded_tokens=[EOS_TOKEN_ID], complete_transfers=True)
        return (self.hits[0] or 0) if self.hits else 0

    def probe(self, token_ids: list[int], stored: set) -> int:
        self.stored = set(stored)
        self.runner.scheduler.reset_prefix_cache()
        return self.run(token_ids)


def case_hits(case: tuple, setting: int | None | str) -> list[int]:
    *_, num_prompt, cap, probes = case
    sim = Sim(case, setting)
    tokens = prompt(num_prompt)
    sim.run(tokens, {"max_offload_tokens": cap} if cap is not None else None)
    stored = set(sim.stored)
    hits = []
    for p in probes:
        if p == "replay":
            hits.append(sim.probe(tokens, stored))
        else:
            hits.append(sim.probe(tokens[:p] + prompt(40, seed=1000 + p), stored))
    return hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True)
    parser.add_argument("--cases", nargs="*", default=sorted(CASES))
    parser.add_argument(
        "--before", type=Path, help="this script's table on another tree"
    )
    args = parser.parse_args()
    before: dict[tuple[str, str], list[str]] = {}
    if args.before:
        for line in args.before.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == len(SETTINGS) + 2 and cells[2].isdigit():
                before[(cells[0], cells[1])] = cells[2:]
    _setup_env(args.tree.resolve())
    import logging

    logging.disable(logging.WARNING)
    header = " | ".join(str(s) for s in SETTINGS)
    print(f"| case | probe | {header} |")
    print("|---|---|" + "---|" * len(SETTINGS))
    for name in args.cases:
        case = CASES[name]
        per_setting = [case_hits(case, s) for s in SETTINGS]
        for i, probe in enumerate(case[-1]):
            label = "replay" if probe == "replay" else f"share {probe}"
            old = before.get((name, label), [])
            cells = " | ".join(
                f"**{old[j]} → {h[i]}**"
                if j < len(old) and old[j] != str(h[i])
                else str(h[i])
                for j, h in enumerate(per_setting)
            )
            print(f"| {name} | {label} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
