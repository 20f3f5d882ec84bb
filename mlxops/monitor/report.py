"""``mlxops report NAME``: one self-contained HTML file of a run, from its mirror.

Data and scripts are inlined (the same chart and view code as the dashboard's, from
``static/``), so the file opens offline and can be attached to an issue; its own
Content-Security-Policy forbids every request. ``--json`` prints the data it draws
(docs/formats.md, "mlxops report --json"): the job document plus ``plan`` and ``bench``.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from mlxops.errors import UserError
from mlxops.jobs.fastsynch import RISK
from mlxops.jobs.record import JobRecord
from mlxops.monitor import bench
from mlxops.monitor.data import Mirror, document
from mlxops.monitor.records import JobDocument
from mlxops.tasks.facts import load_cached_facts

STATIC = Path(__file__).resolve().parent / "static"
POINTS = 4000   # rows per series drawn in the page (--json keeps them all)
# Inline only, nothing fetched: not even an image or a font.
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "img-src data:; base-uri 'none'; form-action 'none'")
SCRIPTS = ("chart.js", "view.js", "report.js")


def plan(record: JobRecord) -> list[dict[str, Any]] | None:
    """``mlxops plan``'s figures per host from the facts provision cached (no host asked);
    None for a job mlxops does not plan (``command:``, ``serve:``), when its inputs no
    longer read (a fine-tuned model moved), or when no host has cached facts."""
    spec = record.job_spec()
    try:
        planner = spec.workload.planner(spec.path)
    except UserError:
        return None
    if planner is None:
        return None
    rows = []
    for host in record.hosts:
        facts = load_cached_facts(host.name)
        memory = facts.memory_bytes if facts else None
        if not memory:
            continue
        ranks = len(record.ranks_on(host.name))
        memory_plan = planner.memory(int(memory), record.world_size, ranks_per_node=ranks,
                                     working_set=facts.ranks_working_set)
        rows.append({"host": host.name, "memory_bytes": int(memory), "ranks": ranks,
                     **memory_plan.to_dict()})
    return rows or None


def report_document(mirror: Mirror, *, points: int | None = None) -> JobDocument:
    record = mirror.record
    extras = {"plan": plan(record), "bench": bench.latest([h.name for h in record.hosts])}
    if record.fast_synch:   # said in the report, with the risk (mlxops/jobs/fastsynch.py)
        extras["fast_synch"] = RISK
    return document(mirror, points=points, extras=extras)


def _script_data(doc: dict[str, Any]) -> str:
    # Inside <script>, "</script" ends the element and "<!--" changes how it is parsed: no
    # "<" at all then (JSON has it only inside strings, where "\u003c" reads the same).
    return json.dumps(doc).replace("<", "\\u003c").replace(">", "\\u003e")


def _inline(name: str) -> str:
    return (STATIC / name).read_text().replace("</script", "<\\/script")


def html_report(doc: JobDocument) -> str:
    title = html.escape(f"mlxops report: {doc.name}")
    scripts = "\n".join(f"<script>\n{_inline(name)}\n</script>" for name in SCRIPTS)
    risk = doc.extras.get("fast_synch")   # put there by report_document
    warning = f'<p class="warning">{html.escape(risk)}</p>' if risk else ""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{(STATIC / "app.css").read_text()}
</style>
</head>
<body>
<header><h1>{title}</h1>{warning}</header>
<main><section id="report"><noscript>This report draws its plots with JavaScript; the data
is in the mlxops-data element of this file.</noscript></section></main>
<script type="application/json" id="mlxops-data">{_script_data(doc.to_dict())}</script>
{scripts}
</body>
</html>
"""


def write(doc: JobDocument, target: Path) -> Path:
    target.write_text(html_report(doc))
    return target
