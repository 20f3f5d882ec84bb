"""``mlxops monitor``'s view of a recorded run, at a fixed width (a snapshot each of the
running and of the finished copy of tests/unit/data/monitor/), and its pieces."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from mlxops.cli import cli
from mlxops.monitor.data import MirrorReader, document
from mlxops.monitor.live import duration, render, sparkline

DATA = Path(__file__).parents[1] / "data" / "monitor"
WIDTH = 100


def view(which: str, home: Path, width: int = WIDTH) -> str:
    """The view of the recorded mirror ``which``, 2 s after its last look, as plain text."""
    shutil.copytree(DATA / which, home / "jobs", dirs_exist_ok=True)
    mirror = MirrorReader("tiny-lm").read()
    out = Console(width=width, record=True, color_system=None, force_terminal=False,
                  file=open("/dev/null", "w"))
    out.print(render(document(mirror), mirror.samples[-1]["time"] + 2, width))
    return out.export_text()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("which", ["running", "finished"])
def test_a_recorded_run_renders_as_its_snapshot(home, which):
    assert view(which, home) == (DATA / f"monitor_{which}.txt").read_text()


def test_the_view_fits_80_columns(home):
    text = view("running", home, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "tiny-lm  running  step 239/300" in text


def test_sparkline_scales_between_the_least_and_the_most():
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([None, 5, 5, "x"]) == "▄▄"
    assert sparkline(list(range(100)), width=4) == "▁▃▆█"
    assert sparkline([]) == ""


def test_durations_read_at_a_glance():
    assert [duration(s) for s in (None, 3.9, 192, 7500)] == ["-", "3s", "3m12s", "2h05m"]


def test_monitor_once_offline_prints_the_view_and_an_unknown_job_is_bad_input(home):
    shutil.copytree(DATA / "finished", home / "jobs")
    result = CliRunner().invoke(cli, ["monitor", "tiny-lm", "--once", "--offline"])
    assert result.exit_code == 0, result.output
    assert "attempt 1 ended after step 150" in result.output
    bad = CliRunner().invoke(cli, ["monitor", "nope", "--once", "--offline"])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines() == [
        "mlxops: error: no job named 'nope' (known jobs: tiny-lm); start one with "
        "'mlxops launch JOB.yml'"]


if __name__ == "__main__":  # regenerate the snapshots after an intended change
    import os
    import tempfile

    for which in ("running", "finished"):
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["MLXOPS_HOME"] = tmp
            (DATA / f"monitor_{which}.txt").write_text(view(which, Path(tmp)))
    sys.exit(0)
