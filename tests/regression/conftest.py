# SPDX-License-Identifier: Apache-2.0
"""Our regression tests run against the built fork: they drive the real
OffloadingConnectorScheduler through vLLM's own scheduler test harness
(tests/v1/kv_connector/unit/offloading_connector/utils.py in the patched tree),
so the tree's `tests` package must be importable."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREE = Path(os.environ.get("FORK_TREE", ROOT / "upstream" / "vllm"))
if not (TREE / "tests" / "__init__.py").is_file():
    raise pytest.UsageError(
        f"{TREE} is not a built tree: run scripts/apply_and_build.sh"
    )
sys.path.insert(0, str(TREE))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "e2e: end-to-end engine tests (left out by scripts/test.sh --fast)"
    )
