"""``mlxops monitor NAME``: the live terminal view of a job, drawn from its mirror.

:func:`render` is a pure function of the job document (:mod:`mlxops.monitor.data`) and
the time, so a recorded mirror renders the same way every time (the snapshot test);
:func:`run` feeds the mirror (unless offline), reads it and redraws, with rich's ``Live``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from mlxops import console
from mlxops.monitor.data import MirrorReader, decimate, document
from mlxops.monitor.records import JobDocument, Serving
from mlxops.node.protocol import ENDED_STATES, STALLED

BARS = "▁▂▃▄▅▆▇█"
SPARK = 12          # characters of a sparkline
GB = 1024**3


def sparkline(values: Sequence[Any], width: int = SPARK) -> str:
    """The last ``width`` numbers as bars from their minimum to their maximum."""
    numbers = [v for v in values if isinstance(v, (int, float))][-width:]
    if not numbers:
        return ""
    low, high = min(numbers), max(numbers)
    if high - low <= 1e-12 * max(1.0, abs(high)):
        return BARS[3] * len(numbers)
    return "".join(BARS[round((v - low) / (high - low) * (len(BARS) - 1))] for v in numbers)


def duration(seconds: float | None) -> str:
    """``42s``, ``3m12s``, ``2h05m``."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", GB), ("MB", 1024**2), ("KB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def header(doc: JobDocument, now: float) -> Text:
    s = doc.summary
    step = "-" if s.step is None else s.step
    looked = "never looked" if doc.updated is None else \
        f"looked {duration(now - doc.updated)} ago"
    return Text.from_markup(
        f"[bold]{doc.name}[/]  {console.state_markup(doc.state)}  "
        f"step {step}/{s.steps or '?'}  attempt {doc.job.attempt}  "
        f"up {duration(s.elapsed)}  {looked}")


def totals(doc: JobDocument, width: int) -> Text:
    """The cluster's line: loss and tokens/s with their trend, the compute / all-reduce
    split, peak memory."""
    s, m = doc.summary, doc.metrics
    parts = []
    if s.loss_last is not None:
        trend = decimate({"loss": m["loss"]}, SPARK)["loss"]
        parts.append(f"loss {s.loss_last:.4f} {sparkline(trend)}")
    if s.val_loss_last is not None:
        vals = [v for v in m.get("val_loss", []) if v is not None]
        parts.append(f"val loss {s.val_loss_last:.4f} {sparkline(vals[-SPARK:])} (best "
                     f"{s.val_loss_min:.4f} at step {s.val_loss_best_step})")
    if s.tokens_per_sec is not None:
        parts.append(f"tokens/s {s.tokens_per_sec:,.0f} {sparkline(m['tokens_per_sec'])}")
    if s.compute_share is not None:
        parts.append(f"compute {s.compute_share:.0%} {s.compute_time * 1e3:.1f} ms | "
                     f"all-reduce {1 - s.compute_share:.0%} {s.comm_time * 1e3:.1f} ms")
    if s.peak_memory is not None:
        parts.append(f"peak mem {_bytes(s.peak_memory)}")
    if not parts:
        return Text("no metrics yet", style="dim")
    lines = [parts[0]]
    for part in parts[1:]:  # as many parts on a line as fit the width
        if len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += "   " + part
        else:
            lines.append(part)
    return Text("\n".join(lines))


def serving_line(serve: Serving) -> Text:
    """A serve job's line: requests, tokens/s (the canary's) and latency (the probe's),
    each with its trend."""
    last, history = serve.last, serve.history
    parts = []
    if last.get("requests") is not None:
        parts.append(f"requests {last['requests']:,}")
    if last.get("tokens_per_sec") is not None:
        parts.append(f"tokens/s {last['tokens_per_sec']:,.0f} (canary) "
                     f"{sparkline(history['tokens_per_sec'])}")
    if last.get("latency") is not None:
        parts.append(f"latency {last['latency'] * 1e3:,.0f} ms {sparkline(history['latency'])}")
    return Text("serving: " + ("   ".join(parts) or "no answer to the probe yet"))


def rank_table(doc: JobDocument):
    """Per rank: host, state, step, loss, tokens/s with a sparkline, its node's memory,
    heartbeat age (red when stalled or past the alert)."""
    limit = doc.job.alerts.get("heartbeat_age") or float("inf")
    share = doc.job.alerts.get("memory_share") or float("inf")
    gpu = any(n.gpu for n in doc.nodes)
    cols = [console.column("rank", right=True), console.column("host", wrap=True),
            console.column("state"), console.column("step", right=True),
            console.column("loss", right=True), console.column("tok/s", right=True),
            console.column("trend"), console.column("mem GB", right=True)]
    if gpu:
        cols.append(console.column("gpu %", right=True))
    cols.append(console.column("heartbeat", right=True))
    table = console.table(*cols)
    for r in doc.ranks:
        node = doc.node(r.host)
        used, total = (node.memory_used, node.memory_total) if node else (None, None)
        mem = "-" if used is None or not total else f"{used / GB:.1f}/{total / GB:.0f}"
        if used is not None and total and used / total > share:
            mem = f"[bold red]{mem}[/]"
        age = r.heartbeat_age
        beat = "-" if age is None else f"{age:.1f}s"
        if r.state == STALLED or (age is not None and age > limit):
            beat = f"[bold red]{beat}[/]"
        row = [str(r.rank), r.host, console.state_markup(r.state),
               "-" if r.step is None else str(r.step),
               "-" if r.loss is None else f"{r.loss:.4f}",
               "-" if not r.tokens_per_sec else f"{r.tokens_per_sec:,.0f}",
               sparkline(r.history.get("tokens_per_sec", [])), mem]
        if gpu:
            g = ((node.gpu if node else None) or {}).get("utilization")
            row.append("-" if g is None else f"{g:.0f}")
        table.add_row(*row, beat)
    return table


def render(doc: JobDocument, now: float, width: int = 100) -> RenderableType:
    parts: list[RenderableType] = [header(doc, now), totals(doc, width)]
    if doc.serve:
        parts.append(serving_line(doc.serve))
    parts.append(Text(""))
    if doc.ranks:
        parts.append(rank_table(doc))
    else:
        parts.append(Text("no look at the ranks yet", style="dim"))
    created = doc.job.created
    if doc.restarts:
        parts.append(Text("restarts", style="bold"))
        for r in doc.restarts:
            at = "" if r.step is None else f" after step {r.step}"
            parts.append(Text(f"  attempt {r.attempt} ended{at} "
                              f"(+{duration(r.time - created)}): {r.reason}"))
    for node in (n for n in doc.nodes if n.error):
        parts.append(Text.from_markup(f"[magenta]{node.host} not answering[/]: ")
                     + Text(node.error or ""))
    if doc.alerts:
        parts.append(Text("alerts", style="bold red"))
        parts += [Text(f"  {a['message']}", style="red") for a in doc.alerts]
    return Group(*parts)


def run(name: str, feed: Callable[[], object] | None, *, interval: float,
        once: bool) -> JobDocument:
    """Redraw until the job ended (or once); ``feed`` looks at the cluster first (None:
    offline, the mirror only). Returns the last document."""
    reader = MirrorReader(name)

    def look() -> JobDocument:
        if feed is not None:
            feed()
        return document(reader.read())

    doc = look()
    if once or not console.out.is_terminal:
        console.out.print(render(doc, time.time(), console.out.width))
        return doc
    with Live(render(doc, time.time(), console.out.width), console=console.out,
              auto_refresh=False) as live:
        while doc.state not in ENDED_STATES:
            time.sleep(interval)
            doc = look()
            live.update(render(doc, time.time(), console.out.width), refresh=True)
    return doc
