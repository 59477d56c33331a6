# SPDX-License-Identifier: Apache-2.0
"""End-to-end tests: a real vLLM engine on the CPU platform with the
OffloadingConnector and the host-copy spec (e2e.host_offload).

Every test collected under this directory gets the ``e2e`` marker, so
``-m "not e2e"`` (scripts/test.sh --fast) leaves them out. The environment
the in-process engines need is set here, before anything imports vLLM."""

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS_DIR = HERE.parent  # holds the `e2e` package (spec_module_path e2e.host_offload)

ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    # Engine core in this process: ~4 s per engine instead of ~50 s.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # Logprob requests would otherwise compile for 3-15 s.
    "TORCHDYNAMO_DISABLE": "1",
}
for _key, _value in ENV.items():
    os.environ.setdefault(_key, _value)
# The tests set it themselves where they test it.
os.environ.pop("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", None)
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "e2e: end-to-end engine tests (left out by scripts/test.sh --fast)"
    )


# Each E2E test must finish within 3 minutes here (setup included: the first
# test that needs an engine run or the server pays for it).
TEST_TIMEOUT_S = 180


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def gemma_hybrid(models_dir):
    from e2e.tiny_models import gemma3_hybrid

    return gemma3_hybrid(models_dir)


@pytest.fixture(scope="session")
def gemma_swa(models_dir):
    from e2e.tiny_models import gemma3_pure_swa

    return gemma3_pure_swa(models_dir)


@pytest.fixture(scope="session")
def granite(models_dir):
    from e2e.tiny_models import granite_hybrid

    return granite_hybrid(models_dir)
