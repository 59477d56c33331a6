# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the toolchain tests: every test works on its own clone of the
fetched base tree and its own copy of patches/, never on upstream/vllm."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# These tests are of the pin's toolchain: a FORK_BASE of the caller's would
# point the scripts at another base (tests/toolchain/test_bases.py sets its own).
os.environ.pop("FORK_BASE", None)
BASE_TREE = ROOT / "upstream" / "vllm"


def read_lock(path: Path = ROOT / "upstream" / "vllm.lock") -> dict[str, str]:
    entries = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            entries[key] = value
    return entries


LOCK = read_lock()


def git(tree: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), *args],
        check=True,
        capture_output=True,
        text=True,
        env=None if env is None else {**os.environ, **env},
    ).stdout.strip()


class Scripts:
    """Runs scripts/*.sh with FORK_* paths pointing at a test's copies."""

    def __init__(self, tree: Path, patches: Path):
        self.tree = tree
        self.patches = patches
        self.env = dict(os.environ, FORK_TREE=str(tree), FORK_PATCHES=str(patches))

    def run(self, script: str, *args: str, **env: str):
        return subprocess.run(
            ["bash", str(ROOT / "scripts" / script), *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=600,
        )


@pytest.fixture(scope="session")
def base_tree() -> Path:
    if not (BASE_TREE / ".git").is_dir():
        pytest.fail("upstream/vllm is not fetched: run scripts/fetch_upstream.sh")
    return BASE_TREE


@pytest.fixture
def clone(tmp_path, base_tree):
    """Return a function making a fresh clone of the pristine base."""

    def make(name: str = "vllm") -> Path:
        dst = tmp_path / name
        subprocess.run(
            [
                "git",
                "clone",
                "-q",
                "--branch",
                LOCK["BASE_TAG"],
                str(base_tree),
                str(dst),
            ],
            check=True,
            capture_output=True,
        )
        return dst

    return make


@pytest.fixture
def scripts(tmp_path, clone) -> Scripts:
    patches = tmp_path / "patches"
    shutil.copytree(ROOT / "patches", patches)
    return Scripts(clone(), patches)


def commit(
    tree: Path, path: str, text: str, subject: str, trailers: bool = True
) -> None:
    """Append text to a file in tree and commit it with a series-style message."""
    target = tree / path
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a") as f:
        f.write(text)
    git(tree, "add", path)
    body = [subject, "", "Why: a toolchain test."]
    if trailers:
        body += [
            "",
            "Origin: vendor",
            "Upstream-Status: not-needed (test)",
            "Forwarded: no",
            "Signed-off-by: Test <test@example.invalid>",
        ]
    # The author signs off, whatever identity the caller's environment sets
    # (scripts/test.sh exports the series' fixed one).
    test_identity = {"NAME": "Test", "EMAIL": "test@example.invalid"}
    git(
        tree,
        "commit",
        "-q",
        "-m",
        "\n".join(body),
        env={
            f"GIT_{who}_{key}": value
            for who in ("AUTHOR", "COMMITTER")
            for key, value in test_identity.items()
        },
    )
