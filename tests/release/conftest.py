# SPDX-License-Identifier: Apache-2.0
"""Release tests: the wheels scripts/build_wheels.sh wrote to dist/ (run by
scripts/test.sh before this suite). Helpers of tests/e2e are imported from
the `e2e` package (tests/ on sys.path)."""

import os
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parents[1]
ROOT = TESTS_DIR.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))
for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
    os.environ.setdefault(_key, _value)

DIST = Path(os.environ.get("FORK_DIST", ROOT / "dist"))
WORK = Path(os.environ.get("FORK_WHEEL_BUILD", ROOT / "build" / "wheels"))
# A hang guard: the fresh venv and the server start take a few minutes here.
TEST_TIMEOUT_S = 900


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "e2e: end-to-end engine tests (left out by scripts/test.sh --fast)"
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


def built_wheel(target: str) -> Path:
    stamp = WORK / f"{target}.stamp"
    if not stamp.exists():
        pytest.fail(f"no {target} wheel built: run scripts/build_wheels.sh")
    _key, name, _sha = stamp.read_text().split()
    return DIST / name


@pytest.fixture(scope="session")
def cpu_wheel() -> Path:
    return built_wheel("cpu")


@pytest.fixture(scope="session")
def cuda_wheel() -> Path:
    return built_wheel("cuda")
