// Stalwart dashboard: a small single-page app over the JSON API (/api/...). No dependencies.
"use strict";

const BUCKETS = ["productive", "checkpoint_stall", "checkpoint_restore", "lost_work", "detection", "restart",
  "startup", "straggler_slowdown", "shutdown", "other"];
const SVGNS = "http://www.w3.org/2000/svg";
const POLL_MS = 1000;
let timer = null;
let lastOk = 0;
let ended = false;  // the page shows a job that has ended: nothing on it changes any more

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}
function fmtS(x) {
  if (x === null || x === undefined) return "-";
  if (x < 1) return (x * 1000).toFixed(0) + " ms";
  if (x < 120) return x.toFixed(1) + " s";
  if (x < 7200) return (x / 60).toFixed(1) + " min";
  return (x / 3600).toFixed(1) + " h";
}
function pct(x) { return (100 * x).toFixed(1) + "%"; }
function when(ts) { return ts ? new Date(ts * 1000).toLocaleTimeString() : "-"; }
function put(parent, ...kids) { parent.replaceChildren(...kids.filter(k => k !== null && k !== undefined)); }
function pill(text, cls) { return el("span", { class: "pill " + (cls || text), text: String(text) }); }
function bucketColor(b) { return getComputedStyle(document.documentElement).getPropertyValue("--b-" + b).trim() || "#ccc"; }

async function api(path) {
  const r = await fetch(path, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
function banner(msg) {
  const b = document.getElementById("banner");
  b.hidden = !msg;
  b.textContent = msg || "";
}
function setLive(ok) {
  if (ok) lastOk = Date.now();
  const live = document.getElementById("live");
  const stale = Date.now() - lastOk > 5000;
  live.classList.toggle("stale", stale);
  live.classList.toggle("ended", !stale && ended);
  live.textContent = stale ? "disconnected" : ended ? "ended" : "live";
  live.title = stale ? "no answer from the dashboard for 5 s"
    : ended ? "this job has ended: its page no longer changes" : "updates every second";
}
function table(id, cols, rows) {
  const head = el("tr", {}, ...cols.map(c => el("th", { class: c.num ? "num" : "", text: c.label })));
  const body = el("tbody");
  for (const r of rows) body.append(r);
  return el("table", { id }, el("thead", {}, head), body);
}
function td(v, cls) { return el("td", { class: cls || "" }, v instanceof Node ? v : document.createTextNode(String(v))); }

// --- pages -------------------------------------------------------------------------------------

async function pageRuns(app) {
  const data = await api("/api/runs");
  const cluster = await api("/api/cluster");
  const rows = data.runs.map(r => {
    const tr = el("tr", { class: "clickable", "data-run": r.id, onclick: () => { location.hash = "#/run/" + encodeURIComponent(r.id); } },
      td(el("a", { href: "#/run/" + encodeURIComponent(r.id), text: r.id })),
      td(pill(r.outcome, r.outcome === "unreadable" ? "bad" : r.outcome)),
      td(pct(r.goodput), "num"), td(r.steps_completed, "num"), td(r.interruptions, "num"),
      td(fmtS(r.wall_s), "num"), td(r.events.toLocaleString(), "num"),
      td(r.error ? pill("ledger error", "bad") : ""));
    return tr;
  });
  const healthy = cluster.nodes.filter(n => n.state === "healthy").length;
  const drained = cluster.nodes.filter(n => n.drained).length;
  put(app, 
    el("h1", { text: "Jobs" }),
    el("div", { class: "kpis" },
      kpi(data.runs.length, "jobs"), kpi(data.runs.filter(r => r.outcome === "running").length, "running"),
      kpi(cluster.nodes.length, "nodes"), kpi(healthy, "healthy nodes"), kpi(drained, "drained nodes")),
    el("div", { class: "card" }, el("h2", { text: "Runs under " + data.root }),
      rows.length ? table("runs", [{ label: "run" }, { label: "outcome" }, { label: "goodput", num: 1 },
        { label: "steps", num: 1 }, { label: "interruptions", num: 1 }, { label: "wall", num: 1 },
        { label: "events", num: 1 }, { label: "" }], rows)
        : el("p", { class: "muted", text: "No run directories with a ledger yet." })));
  banner(data.runs.filter(r => r.error).map(r => r.id + ": " + r.error).join(" | "));
}

function kpi(v, label, id) {
  return el("div", { class: "kpi" }, el("div", { class: "v", id: id || "", text: String(v) }), el("div", { class: "l", text: label }));
}

async function pageRun(app, id) {
  const r = await api("/api/runs/" + encodeURIComponent(id));
  const outcome = r.loading ? "loading" : r.outcome;
  ended = !r.loading && r.finished === true;  // its JobEnded is in the ledger
  const restarts = Object.values(r.restarts_by_cause).reduce((a, b) => a + b, 0);
  const ck = r.checkpoints || {};
  put(app, 
    el("h1", {}, document.createTextNode("Job " + (r.run_id || id) + " "), pill(outcome, r.outcome)),
    el("div", { class: "kpis" },
      kpi(r.started ? pct(r.goodput) : "-", "goodput", "goodput"),
      kpi(r.steps_completed, "steps completed", "steps"),
      kpi(fmtS(r.ideal_step_s), "ideal step"),
      kpi(r.interruptions.length, "interruptions", "n-incidents"),
      kpi(restarts, "restarts"),
      kpi(fmtS(r.wall_s), "wall time"),
      kpi(r.mttr_s.total === null || r.mttr_s.total === undefined ? "-" : fmtS(r.mttr_s.total), "MTTR")),
    r.verdict ? el("div", { class: "card" }, el("h2", { text: "Verdict" }), el("div", { class: "verdict", text: r.verdict })) : null,
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h2", { text: "Goodput over time" }), goodputChart(r.goodput_series)),
      el("div", { class: "card" }, el("h2", { text: "Where the wall time went" }), bucketBar(r.buckets_s, r.wall_s))),
    el("div", { class: "card" }, el("h2", { text: "Step time per rank (last 60 steps; red = slower than the fleet)" }),
      heatmap(r.ranks, r.ideal_step_s)),
    el("div", { class: "card" }, el("h2", { text: "Interruptions" }), incidents(r.interruptions)),
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h2", { text: "Workers" }), workers(r.ranks)),
      el("div", { class: "card" }, el("h2", { text: "Checkpoints" }), checkpoints(ck))),
    el("div", { class: "card" }, el("h2", { text: "Nodes" }), nodesTable(r.nodes)));
  banner(r.error ? "Ledger problem: " + r.error : "");
}

async function pageNodes(app) {
  const c = await api("/api/cluster");
  put(app, el("h1", { text: "Nodes" }), el("div", { class: "card" }, nodesTable(c.nodes, true)));
  banner("");
}

// --- widgets -----------------------------------------------------------------------------------

function goodputChart(series) {
  const W = 520, H = 180, L = 36, B = 22, T = 8, R = 8;
  const s = svg("svg", { id: "goodput-chart", viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": "goodput over time" });
  for (const y of [0, 0.5, 1]) {
    const py = T + (1 - y) * (H - T - B);
    s.append(svg("line", { x1: L, x2: W - R, y1: py, y2: py, stroke: "#e2e5ea" }));
    const t = svg("text", { x: 4, y: py + 4 }); t.textContent = (y * 100) + "%"; s.append(t);
  }
  if (!series.length) {
    const t = svg("text", { x: L + 10, y: H / 2 }); t.textContent = "waiting for the first steps"; s.append(t);
    return s;
  }
  const t0 = series[0][0], t1 = series[series.length - 1][0] || t0 + 1;
  const x = ts => L + (t1 > t0 ? (ts - t0) / (t1 - t0) : 1) * (W - L - R);
  const y = v => T + (1 - Math.max(0, Math.min(1, v))) * (H - T - B);
  const pts = series.map(p => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
  s.append(svg("polyline", { points: pts, fill: "none", stroke: "#2e9d5b", "stroke-width": 2 }));
  const last = series[series.length - 1];
  s.append(svg("circle", { cx: x(last[0]), cy: y(last[1]), r: 3, fill: "#2e9d5b" }));
  const lab = svg("text", { x: L, y: H - 6 }); lab.textContent = when(t0); s.append(lab);
  const lab2 = svg("text", { x: W - R - 60, y: H - 6 }); lab2.textContent = when(t1); s.append(lab2);
  return s;
}

function bucketBar(buckets, wall) {
  const bar = el("div", { class: "bar", id: "buckets" });
  const legend = el("div", { class: "legend" });
  for (const b of BUCKETS) {
    const v = buckets[b] || 0;
    if (v <= 0 || !wall) continue;
    bar.append(el("span", { title: `${b}: ${fmtS(v)}`, style: `width:${(100 * v / wall).toFixed(3)}%;background:${bucketColor(b)}` }));
    legend.append(el("span", {}, el("i", { style: `background:${bucketColor(b)}` }),
      document.createTextNode(`${b.replace(/_/g, " ")} ${fmtS(v)} (${pct(v / wall)})`)));
  }
  return el("div", {}, bar, legend);
}

function heatmap(ranks, ideal) {
  if (!ranks.length) return el("p", { class: "muted", text: "No steps yet." });
  const steps = new Set();
  for (const r of ranks) for (const [st] of r.heat) steps.add(st);
  const cols = [...steps].sort((a, b) => a - b).slice(-60);
  const colIdx = new Map(cols.map((s, i) => [s, i]));
  const rowsShown = ranks.slice(0, 64);
  const cw = Math.max(6, Math.min(14, Math.floor(640 / Math.max(1, cols.length)))), ch = 14, L = 62, T = 4;
  const W = L + cols.length * cw + 4, H = T + rowsShown.length * (ch + 2) + 20;
  const s = svg("svg", { id: "heatmap", viewBox: `0 0 ${W} ${H}`, width: Math.min(W, 1100), role: "img", "aria-label": "step time heat map" });
  const base = ideal > 0 ? ideal : median(ranks.flatMap(r => r.heat.map(h => h[1])));
  rowsShown.forEach((r, i) => {
    const y = T + i * (ch + 2);
    const t = svg("text", { x: 0, y: y + 11 }); t.textContent = `rank ${r.rank}`; s.append(t);
    for (const [st, d] of r.heat) {
      if (!colIdx.has(st)) continue;
      const ratio = base > 0 ? d / base : 1;
      const rect = svg("rect", { x: L + colIdx.get(st) * cw, y, width: cw - 1, height: ch, rx: 2, fill: heatColor(ratio), "data-rank": r.rank });
      const tip = svg("title", {}); tip.textContent = `rank ${r.rank} step ${st}: ${fmtS(d)} (${ratio.toFixed(2)}x)`;
      rect.append(tip); s.append(rect);
    }
  });
  const foot = svg("text", { x: L, y: H - 4 });
  foot.textContent = cols.length ? `steps ${cols[0]}-${cols[cols.length - 1]}; colour = step time / ideal (${fmtS(base)})` : "";
  s.append(foot);
  const wrap = el("div", {}, s);
  if (ranks.length > rowsShown.length) wrap.append(el("p", { class: "muted", text: `first 64 of ${ranks.length} ranks shown` }));
  return wrap;
}
function median(xs) { if (!xs.length) return 0; const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; }
function heatColor(ratio) {
  // 1.0 = green, 1.25 = amber, >= 1.6 = red
  const t = Math.max(0, Math.min(1, (ratio - 1) / 0.6));
  const hue = 140 - 140 * t;
  return `hsl(${hue.toFixed(0)}, 60%, ${(52 - 8 * t).toFixed(0)}%)`;
}

function incidents(list) {
  if (!list.length) return el("p", { class: "muted", id: "no-incidents", text: "No interruptions." });
  const rows = list.map((c, i) => el("tr", { class: "incident" },
    td(i + 1, "num"), td(when(c.onset)), td(pill(c.failure, "bad")), td(c.component), td(c.rank, "num"), td(c.node),
    td(c.step >= 0 ? c.step : "-", "num"), td(fmtS(c.detection_s), "num"), td(fmtS(c.lost_work_s), "num"), td(fmtS(c.recovery_s), "num"),
    td(c.total_s === null ? "ongoing" : fmtS(c.total_s), "num")));
  return table("incidents", [{ label: "#", num: 1 }, { label: "onset" }, { label: "failure" }, { label: "component" },
    { label: "rank", num: 1 }, { label: "node" }, { label: "step", num: 1 }, { label: "detect", num: 1 },
    { label: "lost work", num: 1 }, { label: "recovery", num: 1 }, { label: "cost", num: 1 }], rows);
}

function workers(ranks) {
  if (!ranks.length) return el("p", { class: "muted", text: "No steps yet." });
  const rows = ranks.map(r => el("tr", { class: r.straggler_score > 1.2 ? "straggler" : "" },
    td(r.rank, "num"), td(r.node), td(r.steps, "num"), td(r.last_step, "num"), td(fmtS(r.recent_step_s), "num"),
    td(r.straggler_score === null ? "-" : pill(r.straggler_score.toFixed(2) + "x", r.straggler_score > 1.2 ? "bad" : "good"), "num")));
  return table("ranks", [{ label: "rank", num: 1 }, { label: "node" }, { label: "steps", num: 1 }, { label: "last step", num: 1 },
    { label: "recent step", num: 1 }, { label: "straggler score", num: 1 }], rows);
}

function checkpoints(ck) {
  if (ck && !ck.committed && ck.script_resumes && ck.script_resumes.length)
    return el("div", {}, el("p", { class: "muted", text: "The script saves its own checkpoints (not seen by Stalwart); where it resumed:" }),
      ...ck.script_resumes.map(line => el("p", { class: "wrap", text: line })));
  if (!ck || !ck.committed) return el("p", { class: "muted", text: "No checkpoint committed yet." });
  const rows = [["committed", ck.committed], ["newest step", ck.newest_step], ["newest at", when(ck.newest_ts)],
    ["newest path", ck.newest_path], ["mean stall", fmtS(ck.mean_stall_s)], ["mean persist", fmtS(ck.mean_persist_s)],
    ["restores", ck.restores], ["rejected on load", ck.rejected]].map(([k, v]) => el("tr", {}, td(k), td(v, "wrap")));
  return table("checkpoints", [{ label: "" }, { label: "" }], rows);
}

function nodesTable(nodes, withRun) {
  if (!nodes.length) return el("p", { class: "muted", text: "No node has reported yet." });
  const rows = nodes.map(n => el("tr", { class: "node" },
    td(n.node), td(pill(n.state)), td(n.drained ? pill("drained", "bad") : ""), td(n.drain_reason || n.reason || "", "wrap"),
    td((n.findings || []).filter(f => f.severity !== "ok").map(f => `${f.severity}: ${f.code} ${f.subject}`).join("; ") || "-", "wrap"),
    withRun ? td(n.run || "") : null));
  const cols = [{ label: "node" }, { label: "state" }, { label: "drain" }, { label: "reason" }, { label: "findings" }];
  if (withRun) cols.push({ label: "run" });
  return table("nodes", cols, rows);
}

// --- router ------------------------------------------------------------------------------------

async function render() {
  const app = document.getElementById("app");
  const h = location.hash || "#/";
  document.getElementById("nav-runs").classList.toggle("active", h === "#/" || h.startsWith("#/run/"));
  document.getElementById("nav-nodes").classList.toggle("active", h === "#/nodes");
  ended = false;
  try {
    if (h.startsWith("#/run/")) await pageRun(app, decodeURIComponent(h.slice(6)));
    else if (h === "#/nodes") await pageNodes(app);
    else await pageRuns(app);
    setLive(true);
  } catch (err) {
    banner("Cannot load: " + err.message);
    setLive(false);
  }
}
function loop() {
  clearTimeout(timer);
  render().finally(() => { timer = setTimeout(loop, POLL_MS); });
}
window.addEventListener("hashchange", loop);
loop();
