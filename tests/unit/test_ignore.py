"""gitignore-style rules (mlxops.ignore): patterns, precedence, subdirectory rules."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from mlxops.ignore import Ignore


@pytest.mark.parametrize("pattern, path, is_dir, excluded", [
    ("*.log", "a.log", False, True),
    ("*.log", "deep/er/a.log", False, True),
    ("*.log", "a.logx", False, False),
    ("build/", "build", True, True),
    ("build/", "build", False, False),            # dir-only pattern, a file named build
    ("build/", "src/build/x.o", False, True),     # any level, hides content
    ("/top.txt", "top.txt", False, True),
    ("/top.txt", "sub/top.txt", False, False),    # anchored
    ("doc/*.md", "doc/a.md", False, True),
    ("doc/*.md", "x/doc/a.md", False, False),     # inner slash anchors
    ("doc/*.md", "doc/sub/a.md", False, False),   # * does not cross /
    ("**/cache", "a/b/cache", True, True),
    ("logs/**", "logs/a/b", False, True),
    ("a/**/z", "a/z", False, True),
    ("a/**/z", "a/b/c/z", False, True),
    ("file?.txt", "file1.txt", False, True),
    ("file[0-9].txt", "filex.txt", False, False),
    ("file[!0-9].txt", "filex.txt", False, True),
    ("\\#hash", "#hash", False, True),
    ("# comment", "# comment", False, False),
])
def test_gitignore_patterns(pattern, path, is_dir, excluded):
    assert Ignore([pattern]).excluded(path, is_dir) is excluded


def test_negation_and_last_rule_wins():
    ign = Ignore(["*.txt", "!keep.txt"])
    assert ign.excluded("a.txt") and not ign.excluded("keep.txt")
    # a file inside an excluded directory cannot be re-included (git's rule)
    ign = Ignore(["out/", "!out/keep.txt"])
    assert ign.excluded("out/keep.txt")


def test_rules_of_a_subdirectory_apply_under_it_only():
    ign = Ignore()
    ign.add(["*.log", "/build/"], base="sub")
    assert ign.excluded("sub/a.log") and ign.excluded("sub/deep/a.log")
    assert not ign.excluded("a.log") and not ign.excluded("other/a.log")
    assert ign.excluded("sub/build/x") and not ign.excluded("sub/deep/build/x")


def test_add_file_reads_a_gitignore_and_ignores_a_missing_one(tmp_path):
    (tmp_path / ".gitignore").write_text("# comment\n*.tmp\n\n!keep.tmp\n")
    ign = Ignore()
    ign.add_file(tmp_path / ".gitignore")
    ign.add_file(tmp_path / "absent")
    assert ign.excluded("x.tmp") and not ign.excluded("keep.tmp")


def test_matches_is_the_path_alone_excluded_the_path_or_a_parent():
    ign = Ignore(["out/"])
    assert ign.matches("out", is_dir=True)
    assert not ign.matches("out/x")          # its parent is what matches
    assert ign.excluded("out/x")


def test_under_moves_every_rule_below_a_prefix():
    ign = Ignore(["*.pyc"])
    ign.add(["/data/"], base="sub")
    moved = ign.under("jobs/j1")
    assert moved.excluded("jobs/j1/m.pyc") and moved.excluded("jobs/j1/sub/data/f")
    assert not moved.excluded("jobs/j1/data/f")       # the sub rule stays in sub
    assert not moved.excluded("jobs/j2/sub/data/f")   # nor leaks into another prefix
    assert not moved.excluded("m.pyc")
    assert ign.excluded("m.pyc") and ign.excluded("sub/data/f")  # the original is unchanged


def test_extend_appends_rules_that_win_when_later():
    first = Ignore(["*.txt"])
    first.extend(Ignore(["!keep.txt"]))
    assert first.excluded("a.txt") and not first.excluded("keep.txt")


# --- equal to git ---------------------------------------------------------------------------

_NAMES = ["a", "b", "out", "build", "x.log", "keep.log", "k.txt", "#h", "sp ace"]
_GLOBS = ["*", "*.log", "?", "[ab]", "[!a]*", "k*", "**", "\\!k*", "b\\ "]


def _random_pattern(rng: random.Random) -> str:
    parts = [rng.choice(_NAMES + _GLOBS) for _ in range(rng.choice([1, 1, 2, 3]))]
    pattern = "/".join(parts).replace("#h", "\\#h")
    if rng.random() < 0.2:
        pattern = "/" + pattern
    if rng.random() < 0.25:
        pattern += "/"
    if rng.random() < 0.25:
        pattern = "!" + pattern
    return pattern


def _random_tree(rng: random.Random) -> tuple[set[str], set[str]]:
    """(directories, files): 40 random paths up to three levels deep; a path that is also
    another's parent is a directory."""
    paths = {"/".join(rng.choice(_NAMES) for _ in range(rng.choice([1, 2, 3])))
             for _ in range(40)}
    dirs = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    return dirs, paths - dirs


@pytest.mark.skipif(not shutil.which("git"), reason="git is not installed")
@pytest.mark.parametrize("seed", range(200))
def test_excluded_equals_git_check_ignore(tmp_path, seed):
    """A generated .gitignore at the top and one in a subdirectory, a generated tree:
    every path's answer is git's (``git check-ignore --no-index``)."""
    rng = random.Random(seed)
    dirs, files = _random_tree(rng)
    sub = rng.choice(sorted(dirs)) if dirs else ""
    top_rules = [_random_pattern(rng) for _ in range(rng.randint(1, 6))]
    sub_rules = [_random_pattern(rng) for _ in range(rng.randint(0, 3))] if sub else []
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for d in dirs:
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    for f in files:
        (tmp_path / f).write_text("x")
    (tmp_path / ".gitignore").write_text("\n".join(top_rules) + "\n")
    ign = Ignore()
    ign.add_file(tmp_path / ".gitignore")
    if sub_rules:
        (tmp_path / sub / ".gitignore").write_text("\n".join(sub_rules) + "\n")
        ign.add_file(tmp_path / sub / ".gitignore", sub)
    paths = sorted(dirs | files)
    out = subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "--no-index", "-v",
                          "-n", "-z", "--stdin"], input="\0".join(paths) + "\0",
                         capture_output=True, text=True).stdout.split("\0")
    # -z -v -n: source, line, pattern, path per path; an empty source: not ignored.
    git = {out[i + 3]: bool(out[i]) and not out[i + 2].startswith("!")
           for i in range(0, len(out) - 3, 4)}
    ours = {p: ign.excluded(p, p in dirs) for p in paths}
    wrong = {p: (ours[p], git[p]) for p in paths if ours[p] != git[p]}
    assert not wrong, f"rules {top_rules} + {sub}/: {sub_rules}: (ours, git) {wrong}"
