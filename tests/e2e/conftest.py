# SPDX-License-Identifier: Apache-2.0
"""End-to-end tests: a real vLLM engine on the CPU platform with the
OffloadingConnector and the host-copy spec (e2e.host_offload).

Every test collected under this directory gets the ``e2e`` marker, so
``-m "not e2e"`` (scripts/test.sh --fast) leaves them out. The environment
the in-process engines need is set here, before anything imports vLLM.

Results must not depend on the x86 CPU model: to check a change on an
AVX-512 machine as an AVX2-only machine runs it, put tests/e2e/isa_avx2 on
PYTHONPATH (see its sitecustomize.py). The JUnit report's testsuite
properties say which kernels a run used."""

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


# A hang guard, not a speed requirement: the slowest test (setup included:
# the first that needs an engine run or the server pays for it) took about
# 30 s here (2 cores); an older or busier CPU may take several times that.
TEST_TIMEOUT_S = 600


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


@pytest.fixture(scope="session", autouse=True)
def cpu_isa(record_testsuite_property):
    """Record the ISA the run exercised: ATen's CPU capability, the vLLM
    kernel library loaded (vllm._C on AVX-512 + BF16, _C_AVX2 capped) and
    whether tests/e2e/isa_avx2 capped it."""
    import torch
    from vllm.platforms import current_platform

    from e2e.engine_utils import kernel_libraries

    current_platform.import_kernels()
    info = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "vllm_kernels": ",".join(kernel_libraries()),
        "isa_cap": os.environ.get("E2E_CPU_ISA_CAP", "none"),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "unset"),
    }
    for name, value in info.items():
        record_testsuite_property(name, value)
    return info


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
