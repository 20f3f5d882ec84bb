"""The trainer's metrics.jsonl line: one record, written by the trainer and read back by the
monitor; a line read from a real run (tests/unit/data/monitor) reads as the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxops.node.protocol.decode import ProtocolError
from mlxops.node.protocol.metrics import FIELDS, SERIES, MetricsLine, read_line, read_lines

RECORDED = Path(__file__).parents[1] / "data" / "monitor" / "finished" / "tiny-lm" / "metrics.jsonl"

LINE = MetricsLine(step=5, loss=4.92, tokens_per_sec=10622.7, time=1795356826.3,
                   step_time=0.1446, compute_time=0.0424, comm_time=0.1022, world_size=3,
                   micro_batch=8, accumulation=1, lr=0.0012, active_memory=2353568,
                   peak_memory=17114328, consistency_repairs=1, batch_split=[3, 3, 2])


def test_a_line_survives_the_file():
    text = LINE.line()
    assert text.endswith("\n") and text.count("\n") == 1
    assert read_line(text) == LINE == MetricsLine.from_dict(json.loads(text))


def test_a_recorded_run_reads_whole():
    text = RECORDED.read_text()
    lines = read_lines(text)
    assert len(lines) == len(text.splitlines()) == 60
    assert [m.step for m in lines] == list(range(5, 301, 5))


@pytest.mark.parametrize("name", [f for f in FIELDS if f not in ("consistency_repairs",
                                                                  "batch_split",
                                                                  "planned_memory",
                                                                  "val_loss",
                                                                  "val_perplexity",
                                                                  "trainable_params")])
def test_a_missing_field_is_named(name):
    doc = LINE.to_dict()
    del doc[name]
    with pytest.raises(ProtocolError, match=f"MetricsLine: no {name!r} in"):
        MetricsLine.from_dict(doc)
    assert read_line(json.dumps(doc)) is None   # the monitor leaves it out


def test_a_line_cut_short_is_left_out():
    text = LINE.line()
    assert read_lines(text + text[:40]) == [LINE]


def test_the_series_are_fields():
    assert set(SERIES) <= set(FIELDS)


def test_a_resume_keeps_the_lines_up_to_its_step_and_drops_a_torn_last_line():
    from mlxops.node.protocol.metrics import kept_through

    text = ('{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.5}\n{"step": 3, "loss": 2.1}\n'
            '{"step": 4, "lo')
    assert kept_through(text, 2) == '{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.5}\n'
    kept = kept_through(text, 10)
    assert kept.endswith('2.1}\n') and "lo" not in kept.splitlines()[-1][-5:]
    assert len(kept.splitlines()) == 3
