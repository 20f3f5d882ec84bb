// A job document (mlxops report --json, docs/formats.md) drawn into the page: facts,
// alerts, curves, ranks, nodes, restarts; and the last bench. A serve job (doc.job.serve)
// has its server's figures and curves instead of the training ones. Shared by the dashboard
// (app.js) and the offline report (report.js). Builds DOM nodes only: no HTML strings, no
// inline styles (the dashboard's Content-Security-Policy is default-src 'self').
"use strict";

const MlxopsView = (() => {
  const GB = 1024 ** 3;

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c !== null && c !== undefined) node.append(c);
    }
    return node;
  }

  const fmt = {
    num: (v, digits) => (v === null || v === undefined ? "-"
      : Number(v).toLocaleString("en-US", { maximumFractionDigits: digits ?? 0 })),
    loss: (v) => (v === null || v === undefined ? "-" : Number(v).toFixed(4)),
    pct: (v) => (v === null || v === undefined ? "-" : `${Math.round(v * 100)}%`),
    gb: (v) => (v === null || v === undefined ? "-" : (v / GB).toFixed(1)),
    bytes: (v) => {
      if (v === null || v === undefined) return "-";
      for (const [u, s] of [["GB", GB], ["MB", 1024 ** 2], ["KB", 1024]]) {
        if (v >= s) return `${(v / s).toFixed(1)} ${u}`;
      }
      return `${v} B`;
    },
    dur: (s) => {
      if (s === null || s === undefined) return "-";
      s = Math.max(0, Math.floor(s));
      if (s < 60) return `${s}s`;
      if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
      return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
    },
    minutes: (s) => (s < 120 ? `${Math.round(s)}s` : `${(s / 60).toFixed(s < 600 ? 1 : 0)}m`),
    time: (t) => (t ? new Date(t * 1000).toLocaleString() : "-"),
  };

  function state(s) {
    return el("span", { class: `state state-${s || "unknown"}`, text: s || "-" });
  }

  function table(headers, rows, cls) {
    return el("table", { class: cls || "grid-table" },
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { text: h })))),
      el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) =>
        c instanceof Node ? el("td", {}, c) : el("td", { text: c === null ? "-" : c }))))));
  }

  function facts(doc) {
    const s = doc.summary, j = doc.job;
    const items = [
      ["state", state(doc.state)],
      ["step", `${s.step ?? "-"} / ${s.steps ?? "?"}`],
      ["loss", `${fmt.loss(s.loss_last)} (first ${fmt.loss(s.loss_first)})`],
      ...(s.val_loss_last === null || s.val_loss_last === undefined ? [] : [["validation loss",
        `${fmt.loss(s.val_loss_last)} (best ${fmt.loss(s.val_loss_min)} at step ${s.val_loss_best_step})`]]),
      ["tokens/s", `${fmt.num(s.tokens_per_sec)} (median ${fmt.num(s.tokens_per_sec_median)})`],
      ["compute / all-reduce", s.compute_share === null ? "-"
        : `${fmt.pct(s.compute_share)} / ${fmt.pct(1 - s.compute_share)}`],
      ["ranks", `${j.world_size} on ${j.hosts.length} host(s), ${j.backend}`],
      ["attempt", `${j.attempt} (${s.restarts} restart${s.restarts === 1 ? "" : "s"})`],
      ["running for", fmt.dur(s.elapsed)],
      ["peak memory", fmt.bytes(s.peak_memory)],
    ];
    return el("dl", { class: "facts" }, items.map(([k, v]) => [el("dt", { text: k }),
      el("dd", {}, v)]));
  }

  // A serve job's facts: its server's figures (jobs/serveprobe.py) instead of steps and loss.
  function serveFacts(doc) {
    const s = doc.summary, j = doc.job, spec = j.serve;
    const f = doc.serve || { last: {}, requests_total: null };
    const last = f.last || {};
    const model = typeof spec.model === "string" ? spec.model
      : `job ${spec.model_job} (${spec.model_best ? "best" : spec.model_step === null ? "newest" : `step ${spec.model_step}`})`;
    const items = [
      ["state", state(doc.state)],
      ["requests answered", last.requests === null || last.requests === undefined
        ? fmt.num(f.requests_total) : `${fmt.num(f.requests_total)} (${fmt.num(last.requests)} this attempt)`],
      ["tokens/s (canary)", fmt.num(last.tokens_per_sec)],
      ["latency (probe)", last.latency === null || last.latency === undefined ? "-"
        : `${fmt.num(last.latency * 1e3)} ms`],
      ["model", model],
      ["server", `${spec.bind}:${spec.port} on ${j.hosts[0]}`
        + (j.hosts.length > 1 ? ` (${spec.parallel} over ${j.hosts.length} hosts)` : "")],
      ["attempt", `${j.attempt} (${s.restarts} restart${s.restarts === 1 ? "" : "s"})`],
      ["running for", fmt.dur(s.elapsed)],
    ];
    return el("dl", { class: "facts" }, items.map(([k, v]) => [el("dt", { text: k }),
      el("dd", {}, v)]));
  }

  function alerts(doc) {
    if (!doc.alerts.length) return null;
    return el("ul", { class: "alerts" }, doc.alerts.map((a) =>
      el("li", { class: `alert alert-${a.kind}`, text: a.message })));
  }

  function figure(title, key) {
    const box = el("div", { class: "chart-box", id: `chart-${key}` });
    return [el("figure", {}, el("figcaption", { text: title }), box), box];
  }

  // Timeline events drawn on the curves beside the restarts (which the record has): what
  // changed the run or needs a person. Notifications and the launch itself are listed only.
  const MARKED = ["resumed", "stalled", "stopped", "failed", "alert", "plateau"];
  const marked = (doc) => (doc.events || []).filter((e) => MARKED.includes(e.kind));

  function stepMarkers(doc) {
    return doc.restarts.filter((r) => r.step !== null).map((r, i) => ({
      x: r.step, label: `restart ${i + 1}`, title: `attempt ${r.attempt}: ${r.reason}` }))
      .concat(marked(doc).filter((e) => e.step !== null).map((e) => ({
        x: e.step, label: e.kind, title: e.message, cls: `event-marker event-${e.kind}` })));
  }

  function timeMarkers(doc) {
    return doc.restarts.map((r, i) => ({
      x: r.time - doc.job.created, label: `restart ${i + 1}`,
      title: `attempt ${r.attempt}: ${r.reason}` }))
      .concat(marked(doc).map((e) => ({
        x: e.time - doc.job.created, label: e.kind, title: e.message,
        cls: `event-marker event-${e.kind}` })));
  }

  // The curves. Returns the charts drawn (each an <svg>).
  function charts(root, doc) {
    const m = doc.metrics, since = (t) => t.map((v) => v - doc.job.created);
    const grid = el("div", { class: "charts" });
    root.append(grid);
    const drawn = [];
    const add = (title, key, spec) => {
      const [fig, box] = figure(title, key);
      grid.append(fig);
      drawn.push(MlxopsChart.line(box, { key, ...spec }));
    };
    // Validation losses are on the lines of the steps that evaluated only: their own curve.
    const evals = (m.val_loss || []).map((v, k) => [m.step[k], v]).filter(([, v]) => v !== null);
    const lossSeries = [{ name: "loss", x: m.step, y: m.loss }];
    if (evals.length) {
      lossSeries.push({ name: "validation", x: evals.map(([x]) => x), y: evals.map(([, v]) => v),
                        index: 3 });   // orange beside the blue training loss
    }
    add("loss", "loss", { series: lossSeries,
      markers: stepMarkers(doc), xLabel: "step", xName: "step",
      yFormat: (v) => MlxopsChart.number(v) });
    add("tokens/s (all ranks)", "tokens", {
      series: [{ name: "tokens/s", x: m.step, y: m.tokens_per_sec, index: 1 }],
      markers: stepMarkers(doc), xLabel: "step", xName: "step", yZero: true });
    add("compute vs all-reduce (ms per step)", "split", {
      series: [
        { name: "compute", x: m.step, y: m.compute_time.map((v) => (v === null ? null : v * 1e3)), index: 2 },
        { name: "all-reduce + update", x: m.step, y: m.comm_time.map((v) => (v === null ? null : v * 1e3)), index: 3 }],
      markers: stepMarkers(doc), xLabel: "step", xName: "step", yZero: true,
      // The first step compiles MLX's kernels (6 s cold against 40 ms): kept out of the scale.
      firstApart: true,
      firstLabel: (x, y) => `first step: compiling, ${Math.round(y).toLocaleString("en")} ms`
        + (x > 1 ? ` (in the line of step ${x})` : "") });
    const ranks = doc.ranks.filter((r) => r.history && r.history.time && r.history.time.length);
    add("tokens/s per rank (heartbeats)", "rank-tokens", {
      series: ranks.map((r) => ({ name: `r${r.rank} ${r.host}`, x: since(r.history.time),
        y: r.history.tokens_per_sec, index: r.rank })),
      markers: timeMarkers(doc), xLabel: "time since launch", xName: "t",
      xFormat: fmt.minutes, yZero: true });
    drawn.push(memoryChart(grid, doc));
    return drawn;
  }

  function memoryChart(grid, doc) {
    const nodes = doc.nodes.filter((n) => n.history && n.history.time && n.history.time.length);
    const [fig, box] = figure("memory in use per node (GB)", "memory");
    grid.append(fig);
    return MlxopsChart.line(box, { key: "memory",
      series: nodes.map((n, i) => ({ name: n.host, x: n.history.time.map((v) => v - doc.job.created),
        y: n.history.memory_used.map((v) => (v === null ? null : v / GB)), index: i })),
      markers: timeMarkers(doc), xLabel: "time since launch", xName: "t",
      xFormat: fmt.minutes, yZero: true });
  }

  // A serve job's curves over time: requests answered (every attempt's added up), the
  // canary's tokens/s, the probe's latency; and memory per node. No training panel.
  function serveCharts(root, doc) {
    const grid = el("div", { class: "charts" });
    root.append(grid);
    const h = (doc.serve || {}).history || { time: [], requests_total: [], tokens_per_sec: [], latency: [] };
    const t = h.time.map((v) => v - doc.job.created);
    const drawn = [];
    const add = (title, key, spec) => {
      const [fig, box] = figure(title, key);
      grid.append(fig);
      drawn.push(MlxopsChart.line(box, { key, markers: timeMarkers(doc), xLabel: "time since launch",
        xName: "t", xFormat: fmt.minutes, yZero: true, empty: "no answer to the probe yet", ...spec }));
    };
    add("requests answered (since launch)", "serve-requests", {
      series: [{ name: "requests", x: t, y: h.requests_total, index: 0 }] });
    add("tokens/s (the watchdog's 16-token canary)", "serve-tokens", {
      series: [{ name: "tokens/s", x: t, y: h.tokens_per_sec, index: 1 }] });
    add("latency (ms, one-token probe)", "serve-latency", {
      series: [{ name: "latency ms", x: t, y: h.latency.map((v) => (v === null ? null : v * 1e3)), index: 3 }] });
    drawn.push(memoryChart(grid, doc));
    return drawn;
  }

  function serveRanks(doc) {
    const spec = doc.job.serve;
    return table(["rank", "host", "state", "role"], doc.ranks.map((r) => [String(r.rank), r.host,
      state(r.state), r.rank === 0 ? `HTTP on ${spec.bind}:${spec.port}`
        : `its share of the model (${spec.parallel})`]));
  }

  function ranks(doc) {
    const limit = doc.job.alerts.heartbeat_age || Infinity;
    return table(["rank", "host", "state", "step", "loss", "tokens/s", "heartbeat"],
      doc.ranks.map((r) => [String(r.rank), r.host, state(r.state), r.step ?? "-",
        fmt.loss(r.loss), fmt.num(r.tokens_per_sec),
        el("span", { class: r.state === "stalled" || r.heartbeat_age > limit ? "bad" : "",
                     text: r.heartbeat_age === null ? "-" : `${r.heartbeat_age.toFixed(1)}s` })]));
  }

  function nodes(doc) {
    const share = doc.job.alerts.memory_share || Infinity;
    return table(["host", "memory GB", "in use", "peak", "load", "GPU", "looked"],
      doc.nodes.map((n) => {
        if (n.error) return [n.host, el("span", { class: "bad", text: n.error }), "", "", "", "", ""];
        const used = n.memory_total ? n.memory_used / n.memory_total : null;
        const meter = el("meter", { min: 0, max: 1, value: used ?? 0, high: share === Infinity ? 1 : share,
                                    optimum: 0, title: fmt.pct(used) });
        return [n.host, `${fmt.gb(n.memory_used)} / ${fmt.gb(n.memory_total)}`,
          el("span", { class: used > share ? "bad" : "" }, meter, ` ${fmt.pct(used)}`),
          fmt.pct(n.memory_peak_share), n.load ? n.load.map((x) => x.toFixed(2)).join(" ") : "-",
          n.gpu && n.gpu.utilization !== null ? `${n.gpu.utilization}%` : "-",
          fmt.dur(doc.generated - n.time) + " ago"];
      }));
  }

  function restarts(doc) {
    if (!doc.restarts.length) return el("p", { class: "quiet", text: "none" });
    return el("ol", { class: "restarts" }, doc.restarts.map((r) => el("li", {
      text: `attempt ${r.attempt} ended${r.step === null ? "" : ` after step ${r.step}`} ` +
            `(${fmt.dur(r.time - doc.job.created)} after launch): ${r.reason}` })));
  }

  function timeline(doc) {
    const found = doc.events || [];
    if (!found.length) return el("p", { class: "quiet", text: "none yet" });
    return el("ol", { class: "events" }, found.map((e) => el("li", { class: `event-${e.kind}` },
      el("span", { class: "event-when", text: `+${fmt.dur(e.time - doc.job.created)}` }),
      el("span", { class: "event-kind", text: e.kind }),
      el("span", { text: e.message }))));
  }

  // The whole job: returns the charts drawn.
  function job(root, doc) {
    root.textContent = "";
    const serving = Boolean(doc.job.serve);
    root.append(el("h2", { text: serving ? `${doc.name} (serving)` : doc.name }),
                serving ? serveFacts(doc) : facts(doc));
    if (doc.job.message) root.append(el("p", { class: "quiet", text: doc.job.message }));
    const a = alerts(doc);
    if (a) root.append(a);
    const drawn = serving ? serveCharts(root, doc) : charts(root, doc);
    root.append(el("h3", { text: "Ranks" }), serving ? serveRanks(doc) : ranks(doc),
                el("h3", { text: "Nodes" }), nodes(doc),
                el("h3", { text: "Restarts" }), restarts(doc),
                el("h3", { text: "Events" }), timeline(doc));
    return drawn;
  }

  function bench(root, b) {
    root.textContent = "";
    if (!b) {
      root.append(el("p", { class: "quiet",
        text: "No bench yet: mlxops bench INVENTORY measures links, all-reduce and the best ring." }));
      return;
    }
    const bw = b.bandwidth_gbps;
    root.append(el("p", {}, `${fmt.time(b.time)}, ${b.hosts.length} hosts (${b.hosts.join(", ")}); `
      + `links ${b.pairs ? `${fmt.num(bw.min, 2)}-${fmt.num(bw.max, 2)} Gbit/s, median ${fmt.num(bw.median, 2)}` : "not measured"}`
      + (b.slowest ? `; slowest ${b.slowest.src} -> ${b.slowest.dst} ${fmt.num(b.slowest.gbps, 2)} Gbit/s` : "")));
    if (b.ring) {
      root.append(el("p", {}, `best ring: ${b.ring.order.join(" -> ")} (slowest link `
        + `${fmt.num(b.ring.bottleneck_gbps, 2)} Gbit/s)`));
    }
    if (b.allreduce.length) {
      root.append(el("p", { text: `all-reduce: average bus bandwidth ${fmt.num(b.avg_busbw_gbps, 2)} Gbit/s (sizes from 1 MiB)` }),
        table(["size", "time us", "busbw Gbit/s", "wrong"], b.allreduce.map((a) => [
          fmt.bytes(a.bytes), fmt.num(a.time_us, 1), fmt.num(a.busbw_gbps, 2), a.wrong ?? "-"])));
    }
    if (b.findings.length) {
      root.append(el("ul", { class: "findings" }, b.findings.map((f) => el("li", { text: f }))));
    }
  }

  return { el, fmt, state, table, job, bench };
})();
