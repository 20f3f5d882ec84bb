"""Delta sync: collecting a tree, manifests and diffing, against a real local shell."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mlxops.sync import DEFAULT_EXCLUDES, collect, parse_manifest, sync_files
from mlxops.tasks.sync import bundle
from mlxops.transport import LocalConnection


def sync_tree(conn, src: Path, dest: str, **kwargs):
    """``dest`` a copy of ``src`` (what provision's sync task does with its bundle)."""
    files, ignore = collect(src)
    return sync_files(conn, files, dest, ignore=ignore, **kwargs)


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_collect_excludes_and_nested_gitignore(tmp_path):
    src = tree(tmp_path / "src", {
        ".gitignore": "*.log\n/data/\n", "a.py": "", "x.log": "", "data/big": "",
        "pkg/__pycache__/m.cpython-311.pyc": "", "pkg/m.py": "", "pkg/m.pyc": "",
        ".git/HEAD": "", "sub/.gitignore": "secret*\n!secret.example\n",
        "sub/secret.key": "", "sub/secret.example": "", "sub/data/ok": "",
    })
    files, ignore = collect(src, DEFAULT_EXCLUDES)
    assert sorted(files) == [".gitignore", "a.py", "pkg/m.py", "sub/.gitignore",
                             "sub/data/ok", "sub/secret.example"]
    # node paths are filtered with the same rules: these are never deleted there
    assert ignore.excluded("pkg/__pycache__/m.cpython-311.pyc")
    assert ignore.excluded("sub/secret.key")
    assert not ignore.excluded("sub/data/ok")


def test_collect_with_prefix_shifts_rules(tmp_path):
    src = tree(tmp_path / "w", {".gitignore": "/out/\n", "out/x": "", "t.py": ""})
    files, ignore = collect(src, DEFAULT_EXCLUDES, prefix="jobs/j1")
    assert sorted(files) == ["jobs/j1/.gitignore", "jobs/j1/t.py"]
    assert ignore.excluded("jobs/j1/out/x") and not ignore.excluded("jobs/j2/out/x")


def test_parse_shell_manifest():
    text = "abc 644 ./a b.txt\ndef 755 ./d/run.sh\n"
    assert parse_manifest(text, python=False) == {"a b.txt": ("abc", 0o644),
                                                  "d/run.sh": ("def", 0o755)}


@pytest.mark.parametrize("python", [sys.executable, None], ids=["python", "shell"])
def test_sync_cycle(tmp_path, python):
    conn = LocalConnection("local")
    src = tree(tmp_path / "src", {"a.py": "1", "d/b.txt": "2", "d/e/c.txt": "3",
                                  "it's $(x).txt": "4", ".gitignore": "*.tmp\n", "z.tmp": ""})
    os.chmod(src / "a.py", 0o755)
    dest = str(tmp_path / "node dir")
    first = sync_tree(conn, src, dest, python=python)
    assert first.added == [".gitignore", "a.py", "d/b.txt", "d/e/c.txt", "it's $(x).txt"]
    assert first.bytes_sent > 0
    assert os.stat(Path(dest) / "a.py").st_mode & 0o777 == 0o755
    again = sync_tree(conn, src, dest, python=python)
    assert not again.has_changes and again.bytes_sent == 0

    (src / "d/b.txt").write_text("changed")
    (src / "d/e/c.txt").unlink()
    (src / "d/e").rmdir()
    (Path(dest) / "z.tmp").write_text("node-made, excluded: kept")
    check = sync_tree(conn, src, dest, python=python, check=True)
    assert (check.changed, check.deleted) == (["d/b.txt"], ["d/e/c.txt"])
    assert (Path(dest) / "d/e/c.txt").exists()  # check changed nothing

    done = sync_tree(conn, src, dest, python=python)
    assert (done.added, done.changed, done.deleted) == ([], ["d/b.txt"], ["d/e/c.txt"])
    assert (Path(dest) / "d/b.txt").read_text() == "changed"
    assert not (Path(dest) / "d/e").exists()  # emptied directory removed
    assert (Path(dest) / "z.tmp").exists()
    assert not sync_tree(conn, src, dest, python=python).has_changes
    assert "+ " not in done.diff() and "~ d/b.txt\n- d/e/c.txt\n" == done.diff()


def test_the_bundle_leaves_the_bytecode_a_node_writes_beside_the_package(tmp_path):
    # A node that ran `python -m mlxops.node` has code/mlxops/__pycache__/: a provision
    # after a job must report ok, not delete it again every time.
    files, roots, ignore = bundle()
    conn = LocalConnection("local")
    dest = str(tmp_path / "code")
    sync_files(conn, files, dest, roots=roots, ignore=ignore, python=sys.executable)
    cache = Path(dest) / "mlxops" / "__pycache__"
    cache.mkdir()
    (cache / "__init__.cpython-311.pyc").write_bytes(b"\0")
    again = sync_files(conn, files, dest, roots=roots, ignore=ignore, python=sys.executable)
    assert not again.has_changes, again.diff()
    assert (cache / "__init__.cpython-311.pyc").exists()
