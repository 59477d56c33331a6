# SPDX-License-Identifier: Apache-2.0
"""Smoke check of the build: vLLM imports from the patched tree, the platform is
the CPU platform, a real compiled kernel gives the reference result, and which
patches are applied. Run with the venv's python: smoke_check.py TREE BASE_TAG."""

import pathlib
import subprocess
import sys

tree = pathlib.Path(sys.argv[1]).resolve()
base_tag = sys.argv[2]

import torch  # noqa: E402

import vllm  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402

src = pathlib.Path(vllm.__file__).resolve()
if tree not in src.parents:
    sys.exit(f"smoke: vllm imports from {src}, not from the tree {tree}")
if not current_platform.is_cpu():
    sys.exit(f"smoke: platform is {type(current_platform).__name__}, not the CPU one")

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
print(f"smoke: platform {type(current_platform).__name__}, rms_norm max error {err:.1e}")
print(f"smoke: {len(patches)} patches applied on {base_tag}")
for subject in patches:
    print(f"smoke:   {subject}")
