"""Each sandbox node account's $TMPDIR, and the compiled MLX kernels a second account starts
with (mlxops.sandbox.nodes): files only, no root needed (the account is the test's own)."""

from __future__ import annotations

import os
import pwd

from mlxops.sandbox import kernels, nodes
from mlxops.sandbox.layout import SHELL_USERS

KERNEL = "Cf4IBroadcastBDf4ODivideAC_VC_f4_8248777770799913213_contiguous"  # as MLX names one


def test_the_bash_and_zsh_accounts_never_share_a_tmpdir():
    bash, zsh = (nodes.node_tmp(SHELL_USERS[shell]) for shell in ("bash", "zsh"))
    assert bash == nodes.NODE_TMP
    assert zsh != bash and bash not in zsh.parents and zsh not in bash.parents


def test_a_second_account_starts_with_the_finished_kernels_it_lacks(tmp_path):
    me = pwd.getpwuid(os.getuid())
    source, target = tmp_path / "first" / "mlx", tmp_path / "second" / "mlx"
    cpu = source / "0.32.4" / "cpu"
    cpu.mkdir(parents=True)
    (cpu / f"lib{KERNEL}.so").write_bytes(b"\x7fELF kernel")
    (cpu / f"lib{KERNEL}.so").chmod(0o755)
    (cpu / f"{KERNEL}.cpp").write_text("// source\n")
    (cpu / "tmp_397087ba.cpp").write_text("// g++ still at it\n")
    mine = target / "0.32.4" / "cpu" / f"{KERNEL}.cpp"
    mine.parent.mkdir(parents=True)
    mine.write_text("// the second account's own\n")

    kernels.seed(source, target, me)

    got = sorted(p.name for p in (target / "0.32.4" / "cpu").iterdir())
    assert got == [f"{KERNEL}.cpp", f"lib{KERNEL}.so"]       # no tmp_*, no .seed-* left
    copied = target / "0.32.4" / "cpu" / f"lib{KERNEL}.so"
    assert copied.read_bytes() == b"\x7fELF kernel" and copied.stat().st_mode & 0o777 == 0o755
    assert mine.read_text() == "// the second account's own\n"  # what it has stays
    assert copied.stat().st_uid == me.pw_uid


def test_nothing_to_seed_from_is_no_error(tmp_path):
    kernels.seed(tmp_path / "none", tmp_path / "second" / "mlx",
                        pwd.getpwuid(os.getuid()))
    assert not (tmp_path / "second").exists()


def test_a_node_users_kernel_cache_starts_with_what_another_user_compiled(tmp_path):
    """kernels.user_cache: the zsh sandbox's user, whose ranks compile into its own cache
    (<root>/cache -> kernels/<user>), starts with the bash one's finished kernels."""
    me = pwd.getpwuid(os.getuid())
    other = tmp_path / "kernels" / "mlxnode" / "mlx" / "0.32.4" / "cpu"
    other.mkdir(parents=True)
    (other / f"lib{KERNEL}.so").write_bytes(b"\x7fELF kernel")
    mine = kernels.user_cache(me, tmp_path / "kernels")
    assert mine == tmp_path / "kernels" / me.pw_name and mine.stat().st_mode & 0o777 == 0o700
    seeded = mine / "mlx" / "0.32.4" / "cpu" / f"lib{KERNEL}.so"
    assert seeded.read_bytes() == b"\x7fELF kernel" and seeded.stat().st_uid == me.pw_uid
    for folder in (mine / "mlx", seeded.parent):  # private, or the nodes refuse the cache
        assert folder.stat().st_mode & 0o777 == 0o700
