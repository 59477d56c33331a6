# SPDX-License-Identifier: Apache-2.0
"""Replay and shared-prefix hits of the sparse offload stores, per defect case.

Request A is stored through the real OffloadingConnectorScheduler
(bench/offload_sim.py over the tree under test: vLLM's RequestRunner, a
mocked offloading manager answering from an in-memory set); then, one at a
time and against exactly what A stored, the GPU prefix cache is reset and a
request B is looked up: A's replay, or a request sharing A's first s tokens
and then diverging. The
"every-chunk" column is the same tree with the store masks switched off
(every complete chunk stored): the reference a sparse store must match.

    PYTHONPATH=TREE python -m bench.replay_cases --tree TREE [--before TABLE]

TREE: a vLLM source tree with its tests/ (stock 0.32.0, 0.32.0 + upstream-pr/,
or 0.29.0 + patches/); TABLE: this script's output on another tree (e.g.
the stock base), shown as "before -> after" where a cell changed. Run from
the repository root (for the bench package) with the tree's venv;
VLLM_TARGET_DEVICE=cpu and an offline hub cache are set here when unset
(tests/fixtures/hf is served as the hub cache).
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# bench.offload_sim.EVERY_CHUNK: that module imports vLLM, so only once the
# tree is on sys.path.
EVERY_CHUNK = "every-chunk"
SETTINGS: tuple[int | None | str, ...] = (EVERY_CHUNK, None, 0, 32)


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
        ["replay", 63, 48, 36],
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


def case_hits(case: tuple, setting: int | None | str) -> list[int]:
    from bench.offload_sim import OffloadSim, full, groups, swa

    full_block, swa_block, window, eagle, num_prompt, cap, probes = case
    sim = OffloadSim(
        groups(full(full_block), swa(swa_block, window), eagle=(1,) if eagle else ()),
        setting,
    )
    tokens = prompt(num_prompt)
    sim.run(tokens, {"max_offload_tokens": cap} if cap is not None else None)
    stored = set(sim.stored)
    return [
        sim.probe_hit(
            tokens if p == "replay" else tokens[:p] + prompt(40, seed=1000 + p),
            stored,
        )
        for p in probes
    ]


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
