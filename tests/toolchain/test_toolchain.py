# SPDX-License-Identifier: Apache-2.0
"""Behaviour of the fetch / apply / refresh / check scripts."""

import email
import filecmp
import os
import re
import shutil
import subprocess

from conftest import LOCK, ROOT, Scripts, commit, git


def series_names(patches) -> list[str]:
    return [
        line.split("#")[0].strip()
        for line in (patches / "series").read_text().splitlines()
        if line.split("#")[0].strip()
    ]


def subjects(patches) -> list[str]:
    out = []
    for name in series_names(patches):
        header = email.message_from_string((patches / name).read_text())
        subject = " ".join(str(header["Subject"]).split())  # unfold
        out.append(subject.removeprefix("[PATCH] "))
    return out


def applied_subjects(tree) -> list[str]:
    log = git(tree, "log", "--reverse", "--format=%s", f"{LOCK['BASE_TAG']}..HEAD")
    return log.splitlines() if log else []


def make_series(s: Scripts, *changes: tuple[str, str, str]) -> None:
    """Commit (path, text, subject) changes on the test tree and export them."""
    for path, text, subject in changes:
        commit(s.tree, path, text, subject)
    r = s.run("refresh_patches.sh")
    assert r.returncode == 0, r.stderr
    git(s.tree, "reset", "-q", "--hard", LOCK["BASE_TAG"])
    (s.tree / ".git" / "fork-series").unlink()


def test_series_is_consistent():
    """The committed series: entries exist, no orphans, trailers, applies, ruff."""
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check_series.sh")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    patch_files = {p.name for p in (ROOT / "patches").glob("*.patch")}
    assert patch_files == set(series_names(ROOT / "patches"))


def test_apply_on_pristine_base_then_idempotent(scripts):
    base = git(scripts.tree, "rev-parse", "HEAD")
    r = scripts.run("apply_series.sh")
    assert r.returncode == 0, r.stderr
    assert applied_subjects(scripts.tree) == subjects(scripts.patches)
    assert git(scripts.tree, "merge-base", "HEAD", LOCK["BASE_TAG"]) == base
    head = git(scripts.tree, "rev-parse", "HEAD")

    r = scripts.run("apply_series.sh")
    assert r.returncode == 0, r.stderr
    assert "nothing to do" in r.stderr
    assert git(scripts.tree, "rev-parse", "HEAD") == head
    assert git(scripts.tree, "status", "--porcelain") == ""


def test_changed_series_reapplies_from_base(scripts):
    make_series(scripts, ("NOTES.txt", "one\n", "Add one"))
    assert scripts.run("apply_series.sh").returncode == 0
    assert applied_subjects(scripts.tree) == ["Add one"]
    # A different series (here: empty) replaces the applied one.
    (scripts.patches / "series").write_text("")
    r = scripts.run("apply_series.sh")
    assert r.returncode == 0, r.stderr
    assert applied_subjects(scripts.tree) == []


def test_apply_and_build_refuses_a_bad_argument_before_any_step(scripts):
    r = scripts.run("apply_and_build.sh", "--rest")
    assert r.returncode != 0
    assert "usage:" in r.stderr and "--reset" in r.stderr
    assert "== 1/5" not in r.stderr  # no step ran
    r = scripts.run("apply_and_build.sh", "--help")
    assert r.returncode == 0 and "usage:" in r.stdout and "== 1/5" not in r.stderr


def test_refuses_other_version(scripts):
    tag = LOCK["BASE_TAG"]
    (scripts.tree / "pyproject.toml").write_text("# not the release\n")
    commit(scripts.tree, "pyproject.toml", "", "Pretend to be another version")
    git(scripts.tree, "tag", "-f", tag)
    head = git(scripts.tree, "rev-parse", "HEAD")
    r = scripts.run("apply_series.sh")
    assert r.returncode != 0
    assert "is not the pinned vLLM" in r.stderr and "--reset" in r.stderr
    assert git(scripts.tree, "rev-parse", "HEAD") == head


def test_refuses_local_edits_and_reset_discards_them(scripts):
    readme = scripts.tree / "README.md"
    readme.write_text("edited\n")
    r = scripts.run("apply_series.sh")
    assert r.returncode != 0
    assert "local edits" in r.stderr and "README.md" in r.stderr
    assert readme.read_text() == "edited\n"

    r = scripts.run("apply_series.sh", "--reset")
    assert r.returncode == 0, r.stderr
    assert readme.read_text() != "edited\n"
    assert git(scripts.tree, "status", "--porcelain") == ""
    assert applied_subjects(scripts.tree) == subjects(scripts.patches)


def test_refuses_commits_not_from_series(scripts):
    commit(scripts.tree, "MINE.txt", "work in progress\n", "My own work")
    r = scripts.run("apply_series.sh")
    assert r.returncode != 0
    assert "refresh_patches.sh" in r.stderr
    assert applied_subjects(scripts.tree) == ["My own work"]


def test_broken_patch_rolls_back_to_base(scripts):
    make_series(
        scripts,
        ("NOTES.txt", "one\n", "Add one"),
        ("NOTES.txt", "two\n", "Add two"),
    )
    names = series_names(scripts.patches)
    broken = scripts.patches / names[1]
    broken.write_text(broken.read_text().replace(" one\n+two", " uno\n+two"))
    base = git(scripts.tree, "rev-parse", "HEAD")

    r = scripts.run("apply_series.sh")
    assert r.returncode != 0
    assert f"patch {names[1]} does not apply" in r.stderr
    assert "NOTES.txt" in r.stderr  # the failing path is named
    assert git(scripts.tree, "rev-parse", "HEAD") == base
    assert git(scripts.tree, "status", "--porcelain") == ""
    assert not (scripts.tree / ".git" / "rebase-apply").exists()
    assert not (scripts.tree / "NOTES.txt").exists()


def test_refresh_round_trip_is_byte_identical(scripts, clone, tmp_path):
    # The committed series: apply, refresh into a copy, compare.
    assert scripts.run("apply_series.sh").returncode == 0
    out = tmp_path / "refreshed"
    shutil.copytree(scripts.patches, out)
    r = scripts.run("refresh_patches.sh", FORK_PATCHES=str(out))
    assert r.returncode == 0, r.stderr
    cmp = filecmp.dircmp(scripts.patches, out)
    assert not cmp.diff_files and not cmp.left_only and not cmp.right_only

    # A synthetic two-patch series survives apply -> refresh on another clone.
    git(scripts.tree, "reset", "-q", "--hard", LOCK["BASE_TAG"])
    (scripts.tree / ".git" / "fork-series").unlink()
    (scripts.patches / "series").write_text("")
    make_series(
        scripts,
        ("NOTES.txt", "one\n", "Add one"),
        ("docs/NOTES.md", "two\n", "Add two"),
    )
    second = Scripts(clone("second"), scripts.patches)
    assert second.run("apply_series.sh").returncode == 0
    again = tmp_path / "again"
    again.mkdir()
    assert second.run("refresh_patches.sh", FORK_PATCHES=str(again)).returncode == 0
    for name in ["series", *series_names(scripts.patches)]:
        assert (again / name).read_bytes() == (scripts.patches / name).read_bytes()


def test_refresh_keeps_the_block_headings(scripts):
    """The series' comment lines stay in place; a commit added at the end of
    the tree takes a new line after the last entry."""
    (scripts.patches / "series").write_text("")
    make_series(scripts, ("NOTES.txt", "one\n", "Add one"))
    (first,) = series_names(scripts.patches)
    (scripts.patches / "series").write_text(
        f"# header\n\n# (a) fixes\n{first}\n\n# (b) backports\n"
    )
    assert scripts.run("apply_series.sh").returncode == 0
    commit(scripts.tree, "docs/NOTES.md", "two\n", "Add two")
    r = scripts.run("refresh_patches.sh")
    assert r.returncode == 0, r.stderr
    assert "check that each sits under its heading" in r.stderr
    first, second = series_names(scripts.patches)
    assert (scripts.patches / "series").read_text() == (
        f"# header\n\n# (a) fixes\n{first}\n\n# (b) backports\n{second}\n"
    )


def test_check_series_reports_each_defect(scripts):
    make_series(
        scripts,
        ("vllm/fork_ok.py", "# SPDX-License-Identifier: Apache-2.0\nX = 1\n", "Good"),
        ("vllm/fork_bad.py", "import os\nx=( 1 )\n", "Unformatted, unused import"),
    )
    names = series_names(scripts.patches)
    first = scripts.patches / names[0]
    first.write_text(re.sub(r"^Signed-off-by: .*\n", "", first.read_text(), flags=re.M))
    # A folded From: header whose first line matches the sign-off: git am
    # reads another author from it.
    second = scripts.patches / names[1]
    second.write_text(
        second.read_text().replace(
            "From: Test <test@example.invalid>\n",
            "From: Test <test@example.invalid>\n <other@example.invalid>\n",
            1,
        )
    )
    (scripts.patches / "9999-orphan.patch").write_text("")
    with (scripts.patches / "series").open("a") as f:
        f.write("0042-missing.patch\n")
    # A trailer naming a commit of the upstream PR series: one upstream-pr/
    # has passes, one it lacks (renumbered away) is named.
    status = "Upstream-Status: not-needed (test)\n"
    first.write_text(
        first.read_text().replace(status, "Upstream-Status: see upstream-pr/9998\n")
    )
    second.write_text(
        second.read_text().replace(status, "Upstream-Status: see upstream-pr/0001\n")
    )

    r = scripts.run("check_series.sh")
    assert r.returncode != 0
    assert f"{names[0]}: names upstream-pr/9998, which is not a commit of" in r.stderr
    assert "upstream-pr/0001" not in r.stderr
    assert f"{names[0]}: no Signed-off-by" in r.stderr
    assert f"{names[0]}: the author (Test <test@example.invalid>) has no" in r.stderr
    assert f"{names[1]}: the author (test@example.invalid <test@example.invalid>)" in r.stderr
    assert "9999-orphan.patch: not listed in series" in r.stderr
    assert "0042-missing.patch: named in series but missing" in r.stderr

    # With the bookkeeping fixed, the per-patch checks run and catch patch 2.
    (scripts.patches / "9999-orphan.patch").unlink()
    (scripts.patches / "series").write_text("\n".join(names) + "\n")
    second.write_text(second.read_text().replace(" <other@example.invalid>\n", "", 1))
    first.write_text(
        first.read_text()
        .replace("Upstream-Status: see upstream-pr/9998\n", status)
        .replace(
            "Forwarded: no\n",
            "Forwarded: no\nSigned-off-by: Test <test@example.invalid>\n",
        )
    )
    r = scripts.run("check_series.sh")
    assert r.returncode != 0
    assert f"{names[1]}: new file vllm/fork_bad.py has no SPDX header" in r.stderr
    assert f"{names[1]}: ruff check" in r.stderr
    assert f"{names[1]}: ruff format" in r.stderr
    assert names[0] + ":" not in r.stderr
    assert not git(scripts.tree, "worktree", "list").count("\n")  # scratch removed


def test_check_series_wants_the_pr_a_backport_carries(scripts):
    """A patch under the series' (b) heading names the upstream PR it
    backports in its Origin: trailer (DEP-3) and the release that has it in
    Drop-At: (scripts/move_pin.sh drops it there); a Drop-At: that is not a
    release is refused in any block."""
    make_series(
        scripts,
        ("vllm/fork_ok.py", "# SPDX-License-Identifier: Apache-2.0\nX = 1\n", "Good"),
    )
    (name,) = series_names(scripts.patches)
    (scripts.patches / "series").write_text(f"# (b) backports\n{name}\n")
    r = scripts.run("check_series.sh")
    assert r.returncode != 0
    assert f"{name}: in block (b) (backports) but its Origin:" in r.stderr
    assert f"{name}: in block (b) (backports) but has no Drop-At:" in r.stderr
    patch = scripts.patches / name
    patch.write_text(
        patch.read_text().replace(
            "Origin: vendor",
            "Origin: backport, https://github.com/vllm-project/vllm/pull/51886\n"
            "Drop-At: 0.30",
        )
    )
    r = scripts.run("check_series.sh")
    assert r.returncode != 0
    assert "in block (b)" not in r.stderr
    assert f"{name}: Drop-At: '0.30' is not a release (X.Y.Z)" in r.stderr
    patch.write_text(patch.read_text().replace("Drop-At: 0.30", "Drop-At: 0.30.0"))
    r = scripts.run("check_series.sh")
    assert r.returncode == 0, r.stderr


def test_hash_mismatch_saves_nothing(tmp_path):
    lock = tmp_path / "vllm.lock"
    wrong = "0" * 64
    lock.write_text(
        (ROOT / "upstream" / "vllm.lock")
        .read_text()
        .replace(LOCK["VLLM_SDIST_SHA256"], wrong)
    )
    downloads = tmp_path / "downloads"
    tree = tmp_path / "vllm"
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch_upstream.sh")],
        env=dict(
            os.environ,
            FORK_LOCK=str(lock),
            FORK_DOWNLOADS=str(downloads),
            FORK_TREE=str(tree),
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode != 0
    assert "does not match" in r.stderr and wrong in r.stderr
    assert list(downloads.iterdir()) == []
    assert not tree.exists()
