// mlxops line charts: plain SVG, no library, nothing fetched. Shared by the dashboard and
// the offline report (which inlines this file). Every chart is an <svg data-chart=KEY
// data-points=N> whose series are <path class="series sI"> and whose restarts are
// <line class="restart-marker">, so a test (and a person in the inspector) can count them.
"use strict";

const MlxopsChart = (() => {
  const NS = "http://www.w3.org/2000/svg"; // the SVG namespace: a name, never fetched
  const M = { left: 58, right: 14, top: 22, bottom: 30 };

  function svg(tag, attrs, parent) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  // Round numbers for the axis: about `count` of them between lo and hi.
  function ticks(lo, hi, count) {
    const span = hi - lo;
    if (!(span > 0)) return [lo];
    const rough = span / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(rough)));
    const f = rough / mag;
    const step = (f >= 7.5 ? 10 : f >= 3.5 ? 5 : f >= 1.5 ? 2 : 1) * mag;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
      out.push(Number(v.toPrecision(12)));
    }
    return out;
  }

  function number(v) {
    if (v === null || v === undefined || !isFinite(v)) return "-";
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(a >= 1e10 ? 0 : 1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 1e3) return Number((v / 1e3).toPrecision(2)) + "k";
    if (a >= 100) return v.toFixed(0);
    if (a >= 1) return Number(v.toPrecision(3)).toString();
    if (a === 0) return "0";
    return Number(v.toPrecision(2)).toString();
  }

  function extent(values) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) {
      if (v === null || v === undefined || !isFinite(v)) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    return lo <= hi ? [lo, hi] : null;
  }

  function nearest(xs, x) {
    let lo = 0, hi = xs.length - 1;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (xs[mid] < x) lo = mid; else hi = mid;
    }
    return Math.abs(xs[lo] - x) <= Math.abs(xs[hi] - x) ? lo : hi;
  }

  // The index of a series' first drawn point (-1: none).
  function firstPoint(s) {
    return s.y.findIndex((v) => v !== null && v !== undefined && isFinite(v));
  }

  // The y values the scale is made of. With firstApart, each series' first point (a run's
  // first step: MLX compiles its kernels then, 6 s against 40 ms) is left out while the
  // series has others, so one slow step does not flatten the rest; it is drawn at the
  // chart's edge and labelled instead (marked, not hidden). Exported for the tests.
  function scaleValues(series, firstApart) {
    return series.flatMap((s) => {
      const k = firstApart ? firstPoint(s) : -1;
      const rest = s.y.filter((v, j) => j !== k && v !== null && v !== undefined && isFinite(v));
      return k >= 0 && rest.length ? s.y.filter((_, j) => j !== k) : s.y;
    });
  }

  // line(container, {key, series: [{name, x: [], y: []}], markers: [{x, label, title}],
  //   xLabel, yZero, xFormat, yFormat, height, firstApart, firstLabel(x, y)}) draws into
  //   container (replacing it). The <svg> says its scale's top in data-y-max, and the first
  //   point it left out of it in data-first (see scaleValues).
  function line(container, spec) {
    container.textContent = "";
    const width = Math.max(320, Math.floor(container.clientWidth || 640));
    const height = spec.height || 210;
    const xFormat = spec.xFormat || number, yFormat = spec.yFormat || number;
    const series = (spec.series || []).filter((s) => s.x && s.x.length);
    const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`,
                              class: "chart", "data-chart": spec.key || "", role: "img" },
                     container);
    let points = 0;
    const xs = extent(series.flatMap((s) => s.x).concat((spec.markers || []).map((m) => m.x)));
    const ys = extent(scaleValues(series, spec.firstApart));
    if (!xs || !ys) {
      svg("text", { x: width / 2, y: height / 2, class: "empty", "text-anchor": "middle" },
          root).textContent = spec.empty || "no data yet";
      root.setAttribute("data-points", "0");
      return root;
    }
    let [x0, x1] = xs, [y0, y1] = ys;
    if (spec.yZero && y0 > 0) y0 = 0;
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const pad = (y1 - y0) * 0.05;
    y1 += pad;
    if (!(spec.yZero && y0 === 0)) y0 -= pad;
    const W = width - M.left - M.right, H = height - M.top - M.bottom;
    const sx = (x) => M.left + ((x - x0) / (x1 - x0)) * W;
    const sy = (y) => M.top + H - ((Math.min(y, y1) - y0) / (y1 - y0)) * H;  // above: the edge
    root.setAttribute("data-y-max", String(y1));

    const grid = svg("g", { class: "grid" }, root);
    for (const t of ticks(y0, y1, 4)) {
      svg("line", { x1: M.left, x2: M.left + W, y1: sy(t), y2: sy(t) }, grid);
      svg("text", { x: M.left - 6, y: sy(t) + 4, "text-anchor": "end", class: "tick" },
          grid).textContent = yFormat(t);
    }
    for (const t of ticks(x0, x1, Math.max(2, Math.floor(W / 90)))) {
      svg("line", { x1: sx(t), x2: sx(t), y1: M.top + H, y2: M.top + H + 4 }, grid);
      svg("text", { x: sx(t), y: M.top + H + 17, "text-anchor": "middle", class: "tick" },
          grid).textContent = xFormat(t);
    }
    svg("rect", { x: M.left, y: M.top, width: W, height: H, class: "frame" }, root);
    if (spec.xLabel) {
      svg("text", { x: M.left + W, y: height - 2, "text-anchor": "end", class: "axis-label" },
          root).textContent = spec.xLabel;
    }

    series.forEach((s, i) => {
      let d = "", pen = "M";
      for (let k = 0; k < s.x.length; k++) {
        const y = s.y[k];
        if (y === null || y === undefined || !isFinite(y)) { pen = "M"; continue; }
        d += `${pen}${sx(s.x[k]).toFixed(1)},${sy(y).toFixed(1)}`;
        pen = "L";
        points++;
      }
      const path = svg("path", { d, class: `series s${(s.index ?? i) % 8}`,
                                 "data-name": s.name || "" }, root);
      svg("title", {}, path).textContent = s.name || "";
    });

    (spec.markers || []).forEach((m, i) => {
      if (m.x === null || m.x === undefined) return;
      const x = sx(m.x);
      const g = svg("g", { class: "marker" }, root);
      svg("line", { x1: x, x2: x, y1: M.top, y2: M.top + H, class: m.cls || "restart-marker" }, g);
      // Labels staggered over three rows: markers at one step stay readable.
      svg("text", { x: x + 3, y: M.top + 11 + (i % 3) * 11, class: "marker-label" }, g).textContent =
        m.label || `restart ${i + 1}`;
      svg("title", {}, g).textContent = m.title || m.label || "";
    });

    // The first points left out of the scale, above it: at the top edge, each marked and
    // the slowest labelled with its value.
    const over = spec.firstApart ? series.map((s) => [s, firstPoint(s)])
      .filter(([s, k]) => k >= 0 && s.y[k] > y1).map(([s, k]) => ({ x: s.x[k], y: s.y[k] })) : [];
    if (over.length) {
      const top = over.reduce((a, b) => (b.y > a.y ? b : a));
      const g = svg("g", { class: "first-step" }, root);
      for (const p of over) {
        svg("circle", { cx: sx(p.x), cy: M.top, r: 4, class: "first-step-point" }, g);
      }
      const label = spec.firstLabel ? spec.firstLabel(top.x, top.y)
        : `first point: ${yFormat(top.y)}`;
      svg("text", { x: sx(top.x) + 8, y: M.top + 12, class: "first-step-label" }, g)
        .textContent = label;
      svg("title", {}, g).textContent = label + " (kept out of the scale)";
      root.setAttribute("data-first", String(top.y));
    }

    if (series.length > 1) {
      const legend = svg("g", { class: "legend" }, root);
      let lx = M.left + 8;
      series.forEach((s, i) => {
        svg("line", { x1: lx, x2: lx + 14, y1: M.top - 10, y2: M.top - 10,
                      class: `series s${(s.index ?? i) % 8}` }, legend);
        const t = svg("text", { x: lx + 18, y: M.top - 6, class: "legend-label" }, legend);
        t.textContent = s.name;
        lx += 26 + 7 * String(s.name).length;
      });
    }

    // Hover: the values nearest the pointer, for the first series' x.
    const hover = svg("g", { class: "hover", visibility: "hidden" }, root);
    const rule = svg("line", { y1: M.top, y2: M.top + H }, hover);
    const box = svg("rect", { class: "hover-box", rx: 3 }, hover);
    const text = svg("text", { class: "hover-text" }, hover);
    const overlay = svg("rect", { x: M.left, y: M.top, width: W, height: H,
                                  class: "overlay" }, root);
    overlay.addEventListener("mousemove", (ev) => {
      const bounds = root.getBoundingClientRect();
      const px = (ev.clientX - bounds.left) * (width / bounds.width);
      const x = x0 + ((px - M.left) / W) * (x1 - x0);
      const first = series[0];
      const k = nearest(first.x, x);
      const lines = [`${spec.xName || "x"} ${xFormat(first.x[k])}`].concat(series.map((s) => {
        const j = nearest(s.x, first.x[k]);
        return `${s.name}: ${yFormat(s.y[j])}`;
      }));
      text.textContent = "";
      lines.forEach((l, n) => {
        svg("tspan", { x: 0, dy: n ? 14 : 0 }, text).textContent = l;
      });
      const hx = sx(first.x[k]);
      rule.setAttribute("x1", hx);
      rule.setAttribute("x2", hx);
      const bw = 12 + 6.5 * Math.max(...lines.map((l) => l.length));
      const left = hx + bw + 12 > width ? hx - bw - 8 : hx + 8;
      text.setAttribute("transform", `translate(${left + 6},${M.top + 16})`);
      box.setAttribute("x", left);
      box.setAttribute("y", M.top + 3);
      box.setAttribute("width", bw);
      box.setAttribute("height", 8 + 14 * lines.length);
      hover.setAttribute("visibility", "visible");
    });
    overlay.addEventListener("mouseleave", () => hover.setAttribute("visibility", "hidden"));

    root.setAttribute("data-points", String(points));
    return root;
  }

  return { line, ticks, number, scaleValues };
})();
