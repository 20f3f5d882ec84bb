// The offline report: the job document inlined in this file, drawn like the dashboard's
// job view, plus what a report keeps for later: the run's config, the plan, the bench.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const { el, fmt, table } = MlxopsView;
  const doc = JSON.parse(document.getElementById("mlxops-data").textContent);
  const root = document.getElementById("report");
  const drawn = MlxopsView.job(root, doc);

  root.append(el("h3", { text: "Config (as launched)" }));
  // The job's kind of work (jobs/workloads/), its section under the kind's key.
  const kind = doc.job.kind || "command";
  const config = { [kind]: doc.job[kind] };
  config.restart = doc.job.restart;
  config.alerts = doc.job.alerts;
  root.append(el("pre", { class: "config", text: JSON.stringify(config, null, 2) }));
  root.append(el("p", { class: "quiet",
    text: `job file ${doc.job.job_file}, inventory ${doc.job.inventory}` }));

  root.append(el("h3", { text: "Plan (mlxops plan, from the hosts' cached facts)" }));
  if (doc.plan && doc.plan.length) {
    root.append(table(["host", "memory GB", "ranks", "rank GB", "budget GB", "micro x acc",
                       "grad ckpt", "fits"],
      doc.plan.map((p) => [p.host, fmt.gb(p.memory_bytes), String(p.ranks), fmt.gb(p.total_bytes),
        fmt.gb(p.budget_bytes), `${p.micro_batch} x ${p.accumulation}`,
        p.grad_checkpoint ? "on" : "off", p.fits ? "yes" : "NO"])));
  } else {
    root.append(el("p", { class: "quiet",
      text: "no plan: no cached facts of the hosts (mlxops provision caches them), or a command: or serve: job" }));
  }

  root.append(el("h3", { text: "Bench" }));
  const bench = el("div", {});
  root.append(bench);
  MlxopsView.bench(bench, doc.bench);

  const shown = doc.metrics.step.length;
  const rows = doc.job.serve ? `${((doc.serve || {}).history || { time: [] }).time.length} looks at the server`
    : `${doc.metrics_lines} metrics lines (${shown} drawn)`;
  root.append(el("p", { class: "quiet", text: `Generated ${fmt.time(doc.generated)} by mlxops report; `
    + `${rows}, ${doc.nodes.length} nodes.` }));
  // For whoever checks that the plots were drawn (a test, a headless browser).
  document.body.setAttribute("data-drawn",
    String(drawn.filter((c) => Number(c.getAttribute("data-points")) > 0).length));
});
