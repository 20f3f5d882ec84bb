"""``mlxops data prepare INPUT... -o DIR``: a corpus into token shards and a manifest."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from mlxops import console
from mlxops.cli.options import json_option
from mlxops.errors import UserError

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``1.5GiB``, ``1000000``: bytes (binary units)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise UserError(f"--max-memory: {text!r}: a size such as 512M or 2G")
    number, unit = match.groups()
    return int(float(number) * 1024 ** " KMGT".index(unit.upper() or " "))


@contextmanager
def _bar(enabled: bool) -> Iterator[Callable[[str, int, int], None]]:
    """Progress on stderr (a terminal only): one bar per stage, in input bytes."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    if not enabled or not console.err.is_terminal:
        yield lambda stage, done, total: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=console.err,
                  transient=True) as progress:
        tasks: dict[str, int] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=total)
            progress.update(tasks[stage], completed=done)

        yield update


@click.group("data")
def data() -> None:
    """Corpora for the bundled trainer: token shards and their manifest."""


@data.command("prepare")
@click.argument("inputs", nargs=-1, required=True)
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False),
              help="Directory of the shards and manifest.json (a job's 'data:').")
@click.option("--tokenizer", default="bytes", show_default=True,
              help="bytes, a tokenizer.json (or a model directory holding one), or "
                   "tiktoken:FILE (an encoding's .tiktoken file; nothing is downloaded).")
@click.option("--train-bpe", type=click.IntRange(2, 1 << 24), metavar="VOCAB", default=None,
              help="Train a byte-level BPE of this vocabulary on the inputs first (saved as "
                   "tokenizer.json in the output).")
@click.option("--field", default="text", show_default=True,
              help="The text field of JSONL lines, Parquet and saved-dataset columns.")
@click.option("--split", default="train", show_default=True,
              help="The split of a saved DatasetDict to read.")
@click.option("--val-fraction", type=float, default=0.01, show_default=True,
              help="Share of documents held out for validation (every 1/f-th).")
@click.option("--shard-tokens", type=int, default=100_000_000, show_default=True,
              help="Tokens per shard.")
@click.option("--max-memory", default="2G", show_default=True,
              help="Peak memory of the preparation (e.g. 512M): text is tokenized in "
                   "batches that fit.")
@json_option
def prepare_command(inputs: tuple[str, ...], out: str, tokenizer: str,
                    train_bpe: int | None, field: str, split: str, val_fraction: float,
                    shard_tokens: int, max_memory: str, as_json: bool) -> None:
    """Tokenize INPUT... (text, JSONL, Parquet, datasets.save_to_disk directories) into
    token shards: a re-run over unchanged input changes nothing."""
    # Here, not at the top: numpy and the tokenizer are this command's, not every command's.
    from mlxops.dataprep import prepare as prep

    options = prep.Options(inputs=inputs, out=Path(out), tokenizer=tokenizer,
                           train_bpe=train_bpe, field=field, split=split,
                           val_fraction=val_fraction, shard_tokens=shard_tokens,
                           max_memory=parse_size(max_memory))
    with _bar(not as_json) as progress:
        report = prep.prepare(options, progress)
    manifest = report.manifest
    if as_json:
        console.print_json({"out": str(out), "up_to_date": report.up_to_date,
                            "written": report.written, "kept": report.kept,
                            "deleted": report.deleted, "input_bytes": report.input_bytes,
                            "seconds": round(report.seconds, 3),
                            "peak_memory": report.peak_memory,
                            "manifest": manifest.to_dict()})
        return
    mib = report.input_bytes / 2**20
    if report.up_to_date:
        click.echo(f"{out}: up to date ({mib:.1f} MiB of input unchanged)")
        return
    rate = mib / report.seconds if report.seconds else 0.0
    click.echo(f"{out}: {manifest.tokens('train'):,} training and {manifest.tokens('val'):,} "
               f"validation tokens, {len(manifest.train)} + {len(manifest.val)} shards "
               f"({manifest.dtype}), vocabulary {manifest.vocab_size} "
               f"({manifest.tokenizer.name})")
    click.echo(f"{len(report.written)} shards written, {len(report.kept)} unchanged, "
               f"{len(report.deleted)} removed; {mib:.1f} MiB in {report.seconds:.1f} s "
               f"({rate:.1f} MiB/s), peak memory {report.peak_memory / 2**20:.0f} MiB")


command = data
