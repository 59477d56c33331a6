# SPDX-License-Identifier: Apache-2.0
"""Opt-in ISA cap: run Python (and every Python child that inherits
PYTHONPATH, e.g. `vllm serve` and its engine core) on an AVX-512 x86 CPU the
way an AVX2-only CPU runs it. Rerun the E2E suite capped with:

    PYTHONPATH=tests/e2e/isa_avx2 .venv/bin/python -m pytest tests/e2e

Python imports ``sitecustomize`` at start-up when it is on sys.path; nothing
else imports this file, so normal runs are not affected.

- ATen dispatches its AVX2 kernels (ATEN_CPU_CAPABILITY), oneDNN (torch's and
  vLLM's) stops at AVX2 (ONEDNN_MAX_CPU_ISA) and so does MKL, torch's fp32
  GEMM (MKL_ENABLE_INSTRUCTIONS): set before torch loads.
- vLLM chooses its kernel library (vllm._C for AVX-512 + BF16, _C_AVX512,
  _C_AVX2) and its AMX / AVX-512-BF16 paths from torch.cpu._is_*_supported(),
  which read cpuinfo, not the environment: those answer False here.
- E2E_CPU_ISA_CAP=avx2 tells the tests (and their JUnit report) the cap is on.
"""

import importlib.abc
import os
import sys

os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
os.environ["MKL_ENABLE_INSTRUCTIONS"] = "AVX2"
os.environ["E2E_CPU_ISA_CAP"] = "avx2"

# What an AVX2-only CPU lacks; torch.cpu._is_avx2_supported stays true.
ABSENT = (
    "_is_avx512_supported",
    "_is_avx512_bf16_supported",
    "_is_vnni_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


def _absent() -> bool:
    return False


def _cap(module) -> None:
    for name in ABSENT:
        setattr(module, name, _absent)


class _CapTorchCpu(importlib.abc.MetaPathFinder):
    """Patches torch.cpu right after it is executed (torch imports it while
    it initialises), without importing torch in every Python process."""

    def find_spec(self, name, path, target=None):
        if name != "torch.cpu":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_cap(module):
            exec_module(module)
            _cap(module)

        spec.loader.exec_module = exec_and_cap
        return spec


if "torch.cpu" in sys.modules:
    _cap(sys.modules["torch.cpu"])
else:
    sys.meta_path.insert(0, _CapTorchCpu())
