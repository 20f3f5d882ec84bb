"""Quoting: every hostile value reaches the command as the same bytes, executing nothing."""

from __future__ import annotations

import subprocess

import pytest

from mlxops import shell

HOSTILE = [
    "$(touch {canary})",
    "`touch {canary}`",
    "a; touch {canary}",
    "a && touch {canary}",
    "a | touch {canary}",
    "'; touch {canary}; '",
    '"; touch {canary}; "',
    "line1\ntouch {canary}",
    "$HOME ${{IFS}} \\ * ? [a] ~ {{a,b}}",
    "-n",
    "",
    "é ü 日本",
    "tab\there",
]


def _sh(script: str) -> str:
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.parametrize("template", HOSTILE)
def test_join_passes_hostile_words_verbatim(tmp_path, template):
    canary = tmp_path / "pwned"
    value = template.format(canary=canary)
    out = _sh(shell.join(["printf", "%s", value]))
    assert out == value
    assert not canary.exists()


@pytest.mark.parametrize("template", HOSTILE)
def test_export_lines_define_exact_values(tmp_path, template):
    canary = tmp_path / "pwned"
    value = template.format(canary=canary)
    env_file = tmp_path / "env.sh"
    env_file.write_text(shell.export_lines({"MLXOPS_TEST_VALUE": value}))
    out = _sh(f". {shell.quote(env_file)}; printf %s \"$MLXOPS_TEST_VALUE\"")
    assert out == value
    assert not canary.exists()


@pytest.mark.parametrize("template", HOSTILE)
def test_with_env_sets_exact_value(tmp_path, template):
    canary = tmp_path / "pwned"
    value = template.format(canary=canary)
    cmd = shell.with_env(["sh", "-c", 'printf %s "$V"'], {"V": value})
    assert _sh(cmd) == value
    assert not canary.exists()


@pytest.mark.parametrize("name", ["A-B", "1A", "A B", "$(x)", "", "A;B"])
def test_bad_env_names_are_refused(name):
    with pytest.raises(ValueError):
        shell.env_assignments({name: "x"})
    with pytest.raises(ValueError):
        shell.export_lines({name: "x"})


def test_path_word_keeps_home_expandable_and_quotes_the_rest(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    canary = tmp_path / "pwned"
    assert _sh("printf %s " + shell.path_word("~")) == str(tmp_path)
    word = shell.path_word(f"~/dir with space/$(touch {canary})")
    assert _sh("printf %s " + word) == f"{tmp_path}/dir with space/$(touch {canary})"
    assert _sh("printf %s " + shell.path_word("/abs/p'q")) == "/abs/p'q"
    assert not canary.exists()


def test_join_refuses_a_plain_string():
    with pytest.raises(TypeError):
        shell.join("rm -rf /")  # type: ignore[arg-type]


def test_a_prepended_value_goes_before_the_current_one_and_stays_quoted():
    from mlxops.shell import Prepend

    value = Prepend("/x y/$(touch pwned).so")
    for script in (shell.export_lines({"LD_PRELOAD": value}) + 'printf %s "$LD_PRELOAD"',
                   shell.with_env(["sh", "-c", 'printf %s "$LD_PRELOAD"'],
                                  {"LD_PRELOAD": value})):
        for before, after in (("", "/x y/$(touch pwned).so"),
                              ("/a.so", "/x y/$(touch pwned).so:/a.so")):
            out = subprocess.run(["sh", "-c", f"LD_PRELOAD={shell.quote(before)}; {script}"],
                                 capture_output=True, text=True)
            assert out.stdout == after
