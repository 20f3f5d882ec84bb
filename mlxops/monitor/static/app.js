// The dashboard: every job with its state, the selected job's curves (polled every 2 s
// from this server's /api/, the only requests the page makes), and the last bench.
"use strict";

(() => {
  const { el, fmt, state } = MlxopsView;
  const POLL_MS = 2000;
  let selected = null;
  let shown = "";

  function fromHash() {
    const m = location.hash.match(/job=([^&]+)/);
    return m ? decodeURIComponent(m[1]) : null;
  }

  async function get(path) {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
    return r.json();
  }

  function jobRows(list) {
    const body = document.getElementById("job-rows");
    body.textContent = "";
    for (const j of list.jobs) {
      const link = el("a", { href: `#job=${encodeURIComponent(j.name)}`, text: j.name });
      const tr = el("tr", { class: j.name === selected ? "selected" : "" },
        el("td", {}, link), el("td", {}, state(j.state)),
        // A serve job has no steps nor loss: its requests answered, its canary's tokens/s.
        el("td", { text: j.serve ? `serving, ${fmt.num(j.requests)} requests`
                                 : `${j.step ?? "-"} / ${j.steps ?? "?"}` }),
        el("td", { text: fmt.loss(j.loss) }), el("td", { text: fmt.num(j.tokens_per_sec) }),
        el("td", { text: String(j.attempt) }), el("td", { text: String(j.restarts) }),
        el("td", { class: j.alerts ? "bad" : "", text: String(j.alerts) }),
        el("td", { text: j.updated ? `${fmt.dur(list.now - j.updated)} ago` : "never" }));
      body.append(tr);
    }
    document.getElementById("no-jobs").hidden = list.jobs.length > 0;
  }

  function pick(jobs) {
    const running = jobs.find((j) => j.state === "running" || j.state === "stalled");
    return (running || jobs[0] || {}).name || null;
  }

  async function poll() {
    const status = document.getElementById("status");
    try {
      const list = await get("/api/jobs");
      selected = fromHash() || selected || pick(list.jobs);
      jobRows(list);
      MlxopsView.bench(document.getElementById("bench-body"), list.bench);
      const root = document.getElementById("job");
      if (selected && list.jobs.some((j) => j.name === selected)) {
        const doc = await get(`/api/job/${encodeURIComponent(selected)}?points=1500`);
        const key = [doc.name, doc.updated, doc.metrics_lines, doc.mirror_generation,
                     doc.state, doc.restarts.length, doc.alerts.length].join("|");
        if (key !== shown) {
          MlxopsView.job(root, doc);
          shown = key;
        }
        root.hidden = false;
      } else {
        root.hidden = true;
      }
      status.textContent = `updated ${new Date().toLocaleTimeString()}`;
      status.className = "ok";
    } catch (err) {
      status.textContent = `cannot reach the dashboard server (${err.message})`;
      status.className = "bad";
    }
  }

  window.addEventListener("hashchange", () => {
    selected = fromHash();
    shown = "";
    poll();
  });
  window.addEventListener("resize", () => { shown = ""; });
  poll();
  setInterval(poll, POLL_MS);
})();
