# SPDX-License-Identifier: Apache-2.0
"""Never ship stale kernels: a patch that changes compiled sources (here a
throw-away patch touching csrc/) is caught by check_series.sh, refused by
apply_and_build.sh and build_wheels.sh with the patch and the file named,
and with FORK_BUILD_KERNELS=1 the wheel build chooses the from-source CPU
kernel build (shown with --plan; a real from-source build takes long)."""

import pytest
from test_toolchain import make_series

PATCH_FILE = "0001-Touch-a-CPU-kernel-source.patch"
KERNEL_SOURCE = "csrc/cpu/activation.cpp"


@pytest.fixture
def kernel_series(scripts):
    make_series(
        scripts,
        (KERNEL_SOURCE, "// a kernel change\n", "Touch a CPU kernel source"),
        ("vllm/fork_note.py", "# SPDX-License-Identifier: Apache-2.0\n", "Add a Python file"),
    )
    return scripts


def assert_refused(r):
    assert r.returncode != 0
    assert f"{PATCH_FILE}: {KERNEL_SOURCE}" in r.stderr, r.stderr
    assert "FORK_BUILD_KERNELS=1" in r.stderr, r.stderr


def test_check_series_flags_compiled_sources(kernel_series):
    r = kernel_series.run("check_series.sh")
    assert_refused(r)
    assert "vllm/fork_note.py" not in r.stderr  # only compiled sources are named


def test_apply_and_build_refuses_before_building(kernel_series):
    r = kernel_series.run("apply_and_build.sh")
    assert_refused(r)
    assert "== 1/5" not in r.stderr  # refused before any step ran


def test_build_wheels_refuses_precompiled_kernels(kernel_series, tmp_path):
    r = kernel_series.run(
        "build_wheels.sh", FORK_DIST=str(tmp_path / "dist"),
        FORK_WHEEL_BUILD=str(tmp_path / "wheels"),
    )  # fmt: skip
    assert_refused(r)
    assert not (tmp_path / "dist").exists()


def test_opt_in_chooses_source_build(kernel_series, tmp_path):
    env = dict(FORK_BUILD_KERNELS="1", FORK_DIST=str(tmp_path / "dist"))
    r = kernel_series.run("build_wheels.sh", "--cpu-only", "--plan", **env)
    assert r.returncode == 0, r.stderr
    assert "kernels built from source (cmake + ninja)" in r.stdout
    assert f"{PATCH_FILE}: {KERNEL_SOURCE}" in r.stderr
    # The CUDA wheel cannot be built with new kernels here: refused, clearly.
    r = kernel_series.run("build_wheels.sh", "--plan", **env)
    assert r.returncode != 0 and "CUDA build machine" in r.stderr, r.stderr
    r = kernel_series.run("check_series.sh", **env)
    assert r.returncode == 0, r.stderr


def test_python_only_series_uses_precompiled_kernels(scripts):
    make_series(scripts, ("vllm/fork_note.py", "# SPDX-License-Identifier: Apache-2.0\n", "Add a Python file"))
    r = scripts.run("build_wheels.sh", "--plan")
    assert r.returncode == 0, r.stderr
    assert "cpu: vllm 0.29.0+fork.1." in r.stdout
    assert "precompiled kernels" in r.stdout
