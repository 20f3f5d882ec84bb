"""The run's own temporary directory and the kernel cache it links to
(mlxops.node.tempdir), made by the node's ``spawn`` command, and the sandbox's shared
cache per node user (mlxops.sandbox.kernels)."""

from __future__ import annotations

import os
import pwd
import stat
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from mlxops.node import protocol, tempdir
from mlxops.node.__main__ import main as node_main
from mlxops.sandbox.kernels import link_node_cache

OTHER_UID = 65534  # nobody: "another user" of the node


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "root" / "runs" / "job"
    run.mkdir(parents=True)
    return run


@pytest.fixture(autouse=True)
def permissive_umask():
    """The node's umask must not be what makes the directories private."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_an_attempt_gets_a_new_private_tmp_whose_mlx_is_the_kernel_cache(run_dir):
    cache, refused = tempdir.prepare(run_dir)
    tmp = run_dir / protocol.TMP_DIR
    assert refused is None and cache == str(run_dir.parent.parent / "cache" / "mlx")
    assert mode(tmp) == 0o700 and tmp.lstat().st_uid == os.geteuid()
    assert os.readlink(tmp / "mlx") == cache and mode(Path(cache)) == 0o700
    assert mode(Path(cache).parent) == 0o700  # made private whatever the umask
    # What a rank leaves: a temp file, and a kernel compiled into the cache.
    (tmp / "scratch").write_text("x")
    (tmp / "mlx" / "0.32.4" / "cpu").mkdir(parents=True, mode=0o775)  # umask 002
    (tmp / "mlx" / "0.32.4" / "cpu" / "libk.so").write_text("kernel")
    assert tempdir.prepare(run_dir) == (cache, None)
    assert sorted(p.name for p in tmp.iterdir()) == ["mlx"]  # the attempt's files went
    assert (Path(cache) / "0.32.4" / "cpu" / "libk.so").read_text() == "kernel"  # kept


def test_a_tmp_that_is_a_link_is_removed_not_followed(run_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    (run_dir / protocol.TMP_DIR).symlink_to(elsewhere)
    tempdir.prepare(run_dir)
    assert (elsewhere / "keep").exists()
    assert not (run_dir / protocol.TMP_DIR).is_symlink()


def unsafe(run_dir: Path, how: str) -> None:
    """Make the run's kernel cache unsafe in one way."""
    cache = protocol.kernel_cache_path(run_dir)
    cache.parent.mkdir(mode=0o700)
    cpu = cache / "0.32.4" / "cpu"
    cpu.mkdir(parents=True, mode=0o775)  # MLX's, under a umask of 002
    cache.chmod(0o700)
    if how == "cache writable by others":
        cache.chmod(0o777)
    elif how == "cache readable by others":
        cache.chmod(0o755)
    elif how == "parent writable by others":
        cache.parent.chmod(0o777)
    elif how == "cache another user's":
        os.chown(cache, OTHER_UID, OTHER_UID)
    elif how == "mlx dir another user's":  # another user ran MLX with it first
        os.chown(cpu, OTHER_UID, OTHER_UID)
    elif how == "cache a file":
        for d in (cpu, cpu.parent):
            d.rmdir()
        cache.rmdir()
        cache.write_text("")


@pytest.mark.parametrize("how, why", [
    ("cache writable by others", "cache/mlx is open to others (mode 777)"),
    ("cache readable by others", "cache/mlx is open to others (mode 755)"),
    ("parent writable by others", "cache is open to others (mode 777)"),
    ("cache another user's", f"cache/mlx belongs to uid {OTHER_UID}"),
    ("mlx dir another user's", f"0.32.4/cpu belongs to uid {OTHER_UID}"),
    ("cache a file", "cache/mlx is not a directory"),
])
def test_an_unsafe_cache_is_not_linked_and_the_answer_says_why(run_dir, how, why):
    if "another user's" in how and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    unsafe(run_dir, how)
    cache, refused = tempdir.prepare(run_dir)
    assert cache is None and why in refused, refused
    tmp = run_dir / protocol.TMP_DIR
    assert mode(tmp) == 0o700 and not (tmp / "mlx").exists()  # MLX compiles in the run's


def test_a_cache_linked_elsewhere_of_the_user_is_used(run_dir, tmp_path):
    disk = tmp_path / "big-disk" / "kernels"
    disk.mkdir(parents=True, mode=0o700)
    (run_dir.parent.parent / "cache").symlink_to(disk)
    cache, refused = tempdir.prepare(run_dir)
    assert refused is None and Path(cache).resolve() == (disk / "mlx").resolve()


def test_spawn_makes_the_tmp_before_it_starts_a_rank_and_answers_with_the_cache(run_dir):
    tmp = run_dir / protocol.TMP_DIR
    # The rank records what it found at start: its tmp already there and private.
    script = (f"{{ stat -c %a {tmp}; ls -l {tmp}; }} > {run_dir}/seen.tmp && "
              f"mv {run_dir}/seen.tmp {run_dir}/seen\n")
    (run_dir / "rank-0.sh").write_text(script)
    args = protocol.spawn_args(str(run_dir), [0])
    out = StringIO()
    with redirect_stdout(out):
        assert node_main(args) == 0
    answer = protocol.parse_answer(args[0], out.getvalue().strip())
    assert answer.kernel_cache == str(protocol.kernel_cache_path(run_dir))
    assert answer.kernel_cache_refused is None
    deadline = time.monotonic() + 10
    while not (run_dir / "seen").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # spawn returns once the rank started, not when it is done
    seen = (run_dir / "seen").read_text()
    assert seen.startswith("700\n") and f"mlx -> {answer.kernel_cache}" in seen


def test_the_sandbox_links_a_node_homes_cache_to_one_per_user(tmp_path):
    me = pwd.getpwuid(os.geteuid())
    base = tmp_path / "kernels"
    home = tmp_path / "home"
    home.mkdir()
    link = link_node_cache(home, me, base)
    assert link == home / ".mlxops" / "cache" and link.is_symlink()
    assert link.resolve() == (base / me.pw_name).resolve() and mode(base / me.pw_name) == 0o700
    run = home / ".mlxops" / "runs" / "j"
    run.mkdir(parents=True)
    assert tempdir.prepare(run) == (str(home / ".mlxops" / "cache" / "mlx"), None)
    assert link_node_cache(home, me, base) == link  # again: the same link
