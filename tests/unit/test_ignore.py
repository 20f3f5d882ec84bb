"""gitignore-style rules (mlxops.ignore): patterns, precedence, subdirectory rules."""

from __future__ import annotations

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
