// mlsched dashboard: renders the merged cluster view pushed by the
// dispatcher over server-sent events (/api/events), or polled from
// /api/view when EventSource is missing. No external code or fonts.
"use strict";

const palette = ["#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#4b5563", "#65a30d"];
const state = { view: null, history: [], colors: {}, updates: 0, rate: null, prev: null, ended: [] };

function color(model) {
  if (!(model in state.colors)) {
    state.colors[model] = palette[Object.keys(state.colors).length % palette.length];
  }
  return state.colors[model];
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function pct(x) { return (100 * x).toFixed(1) + "%"; }
// wilson is the Wilson score interval at 95% of s successes out of n.
function wilson(s, n) {
  const z = 1.96, p = s / n, d = 1 + z * z / n;
  const mid = p + z * z / (2 * n), half = z * Math.sqrt(p * (1 - p) / n + z * z / (4 * n * n));
  return [Math.max(0, (mid - half) / d), Math.min(1, (mid + half) / d)];
}
function ms(v) {
  if (!v || v <= 0) return "-";
  if (v >= 1000) return (v / 1000).toFixed(2) + "s";
  if (v >= 100) return v.toFixed(0) + "ms";
  if (v >= 1) return v.toFixed(1) + "ms";
  return v.toFixed(3) + "ms";
}
function ago(t) {
  const d = (Date.now() - new Date(t).getTime()) / 1000;
  if (!isFinite(d)) return "-";
  if (d < 1) return "now";
  if (d < 120) return d.toFixed(0) + "s ago";
  if (d < 7200) return (d / 60).toFixed(0) + "m ago";
  return (d / 3600).toFixed(1) + "h ago";
}
// age is a heartbeat's age to a tenth of a second (a node beats every
// second; one silent for MLSCHED_NODE_TTL is dead).
function age(t) {
  const d = (Date.now() - new Date(t).getTime()) / 1000;
  if (!isFinite(d)) return "-";
  return d < 120 ? Math.max(0, d).toFixed(1) + "s ago" : ago(t);
}
function duration(ns) {
  const s = ns / 1e9;
  if (s >= 3600) return (s / 3600).toFixed(1) + "h";
  if (s >= 60) return (s / 60).toFixed(0) + "m";
  return s.toFixed(0) + "s";
}

function fillBody(table, rows, emptyText, cols) {
  const body = document.querySelector(table + " tbody");
  body.replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" }, el("td", { colspan: cols }, emptyText))]));
}

function render() {
  const v = state.view;
  if (!v) return;
  const degraded = (v.replicas || []).filter(r => r.degraded);
  const open = (v.models || []).filter(m => m.breaker === "open");
  const unready = [];
  for (const n of v.nodes || []) for (const u of n.unready || []) unready.push({ model: u.name, node: n.name, reason: u.reason });
  const unreadyNames = [...new Set(unready.map(u => u.model))].sort();
  const status = document.getElementById("status");
  if (degraded.length) { status.textContent = "degraded"; status.className = "badge bad"; }
  else if (open.length) { status.textContent = open.length + " breaker(s) open"; status.className = "badge warn"; }
  else if (unready.length) { status.textContent = "unready: " + unreadyNames.join(", "); status.className = "badge warn"; }
  else { status.textContent = "healthy"; status.className = "badge ok"; }
  document.getElementById("replicas").textContent = (v.replicas || []).length + " dispatcher replica(s)";
  state.updates++;
  const upd = document.getElementById("updated");
  upd.dataset.updates = String(state.updates);
  upd.textContent = "updated " + new Date(v.at).toLocaleTimeString();
  document.getElementById("window").textContent = v.window_ns ? "(statistics window " + duration(v.window_ns) + ")" : "";

  const probs = document.getElementById("problems");
  const problems = (v.problems || []).concat(degraded.map(r => r.name + ": " + (r.degraded_reason || "degraded")),
    unready.map(u => "model " + u.model + " unready on " + u.node + ": " + u.reason));
  probs.hidden = problems.length === 0;
  probs.replaceChildren(...problems.map(p => el("div", {}, p)));

  const c = v.counters || {};
  let backlog = 0;
  for (const n of Object.values(v.backlog || {})) backlog += n;
  // tasks/s: results stored between two views.
  const now = new Date(v.at).getTime();
  if (state.prev && now > state.prev.at && (c.results || 0) >= state.prev.results) {
    state.rate = 1000 * ((c.results || 0) - state.prev.results) / (now - state.prev.at);
  }
  if (!state.prev || now > state.prev.at) state.prev = { at: now, results: c.results || 0 };
  const totals = [["succeeded", c.succeeded || 0], ["failed", c.failed || 0], ["rejected", c.rejected || 0],
    ["shed", (c.shed || 0) + (c.unserved_refused || 0)], ["tasks/s", state.rate === null ? "-" : state.rate.toFixed(1)],
    ["waiting", backlog], ["dead letters", v.dead_letters_total || 0], ["cancelled", c.cancelled || 0],
    ["redispatched", c.redispatched || 0], ["lost", c.lost || 0], ["nodes", (v.nodes || []).length]];
  document.getElementById("totals").replaceChildren(...totals.map(([k, n]) =>
    el("div", { class: "card", "data-counter": k }, el("div", { class: "v" }, n), el("div", { class: "k" }, k))));

  const byState = {};
  for (const m of v.models || []) {
    const st = m.breaker || "closed";
    (byState[st] = byState[st] || []).push(m.name);
  }
  const br = document.getElementById("breakers");
  const notClosed = Object.keys(byState).filter(st => st !== "closed").sort();
  br.replaceChildren("breakers: ", ...(notClosed.length === 0
    ? [el("span", { class: "breaker-closed" }, (v.models || []).length ? "all closed" : "-")]
    : notClosed.map(st => el("span", { class: "breaker-" + st, "data-breaker": st }, st + ": " + byState[st].join(", ") + "  "))));
  fillBody("#models", (v.models || []).map(m => el("tr", { "data-model": m.name },
    el("td", {}, el("span", { class: "swatch", style: "background:" + color(m.name) }), m.name),
    el("td", { class: "dispatched" }, m.dispatched), el("td", {}, m.successes), el("td", {}, m.model_errors),
    el("td", {}, m.timeouts), el("td", { class: "success" }, pct(m.success_rate)), el("td", {}, ms(m.p50_ms)),
    el("td", {}, ms(m.p95_ms)), el("td", {}, m.in_flight),
    el("td", { class: "breaker breaker-" + (m.breaker || "none") }, m.breaker || "-"), el("td", {}, pct(m.traffic_share)))),
  "no model statistics yet", 11);

  // Rollouts: both versions' first-attempt success in the current step
  // with Wilson 95% intervals, and their latencies from the models table.
  const rollouts = v.rollouts || [];
  document.getElementById("rollouts-section").hidden = rollouts.length === 0;
  const byName = {};
  for (const m of v.models || []) byName[m.name] = m;
  const side = c => {
    const n = c.successes + c.failures;
    if (n === 0) return "-";
    const [lo, hi] = wilson(c.successes, n);
    return pct(c.successes / n) + " (" + pct(lo) + "–" + pct(hi) + ", n=" + n + ")";
  };
  const lat = name => byName[name] ? ms(byName[name].p50_ms) + " / " + ms(byName[name].p95_ms) : "-";
  fillBody("#rollouts", rollouts.map(r => {
    const inc = (v.models || []).map(m => m.name).filter(n => n !== r.model && n.split("@")[0] === r.family);
    return el("tr", { "data-rollout": r.family }, el("td", {}, r.family), el("td", {}, r.model),
      el("td", { class: "rollout-" + r.state }, r.state + (r.split ? " (pinned split)" : "")),
      el("td", {}, (r.step + 1) + "/" + (r.steps || []).length), el("td", { class: "share" }, pct(r.share)),
      el("td", { class: "new" }, side(r.new)), el("td", { class: "incumbent" }, side(r.incumbent)),
      el("td", {}, lat(r.model) + " · " + (inc.map(lat).join(", ") || "-")),
      el("td", {}, "LLR " + r.llr.toFixed(2) + ": " + r.verdict),
      el("td", { class: "last" }, r.last_to ? ago(r.last_at) + " → " + r.last_to + ": " + r.last_reason : "-"));
  }), "no rollout", 10);

  // Flow control: held tasks by band and tenant, and what was shed,
  // expired or over quota: since start, and over the last minute from the
  // views kept in state.ended.
  const held = v.held_by || [], ended = v.ended_by || [];
  document.getElementById("flow-section").hidden = held.length === 0 && ended.length === 0;
  fillBody("#flow-held", held.map(h => el("tr", { "data-band": h.band, "data-tenant": h.tenant },
    el("td", {}, h.band), el("td", {}, h.tenant), el("td", { class: "held" }, h.held))), "nothing held", 3);
  const key = e => e.band + "/" + e.code;
  const viewAt = Date.parse(v.at) || Date.now();
  state.ended.push({ at: viewAt, counts: Object.fromEntries(ended.map(e => [key(e), e.tasks])) });
  while (state.ended.length > 1 && viewAt - state.ended[1].at >= 60000) state.ended.shift();
  const before = state.ended[0].counts;
  fillBody("#flow-ended", ended.map(e => el("tr", { "data-band": e.band, "data-code": e.code },
    el("td", {}, e.band), el("td", {}, e.code), el("td", { class: "recent" }, e.tasks - (before[key(e)] || 0)),
    el("td", { class: "total" }, e.tasks))), "nothing shed", 4);

  // Worker pools: the autoscaler's last decision per pool.
  const pools = v.autoscale || [];
  document.getElementById("autoscale-section").hidden = pools.length === 0;
  fillBody("#autoscale", pools.map(d => el("tr", { "data-pool": d.pool, class: d.target !== d.current ? "hot" : "" },
    el("td", {}, d.pool), el("td", { class: "current" }, d.current), el("td", { class: "recommended" }, d.target),
    el("td", { class: "needed" }, d.needed), el("td", {}, age(d.at)), el("td", { class: "why" }, d.reason))), "no pool", 6);

  // Queue targets: per (model, node), from the measured service time.
  const targets = v.queue_targets || [];
  document.getElementById("targets-section").hidden = targets.length === 0;
  fillBody("#queue-targets", targets.map(q => el("tr", { "data-model": q.model, "data-node": q.node },
    el("td", {}, q.model), el("td", {}, q.node), el("td", {}, ms(q.service_ms)), el("td", {}, q.samples),
    el("td", { class: "target" }, q.mode === "off" ? "off" : ms(q.target_ms)), el("td", { class: "mode" }, q.mode))), "no model", 6);

  // Costs: budgets (their spending is shared: the highest reading) and
  // the declared cost of the replicas' attempts.
  const budgets = v.budgets || [], cost = v.cost || {};
  const costRows = [];
  for (const [by, m] of [["type", cost.by_type], ["model", cost.by_model], ["tenant", cost.by_tenant]])
    for (const k of Object.keys(m || {}).sort()) costRows.push([by, k, m[k]]);
  document.getElementById("costs-section").hidden = budgets.length === 0 && costRows.length === 0;
  const dur = ns => { const s = Math.round(ns / 1e9); return s % 86400 === 0 ? s / 86400 + "d" : s % 3600 === 0 ? s / 3600 + "h" : s % 60 === 0 ? s / 60 + "m" : s + "s"; };
  fillBody("#budgets", budgets.map(b => el("tr", { "data-budget": b.scope + ":" + b.name, class: b.spent >= 0.8 * b.limit ? "hot" : "" },
    el("td", {}, b.scope + ":" + b.name), el("td", { class: "spent" }, +b.spent.toPrecision(4)), el("td", {}, b.limit),
    el("td", { class: "used" }, pct(b.limit > 0 ? b.spent / b.limit : 0)), el("td", {}, dur(b.period_ns)),
    el("td", {}, dur(Math.max(0, Date.parse(b.ends) - Date.now()) * 1e6)), el("td", {}, b.action))), "no budget", 7);
  fillBody("#costs", costRows.map(([by, k, x]) => el("tr", { "data-cost": by + ":" + k },
    el("td", {}, by), el("td", {}, k), el("td", { class: "cost" }, +x.toPrecision(4)))), "no declared cost", 3);

  fillBody("#nodes", (v.nodes || []).map(n => {
    const bar = el("span", { class: "bar" + (n.load >= 0.9 ? " hot" : "") }, el("span", { style: "width:" + Math.min(100, 100 * n.load).toFixed(0) + "%" }));
    const models = (n.models || []).join(", ") + (n.unready || []).map(u => (n.models && n.models.length ? ", " : "") + u.name + " (unready)").join("");
    // The host (container) name the node announces, then its id, cut with
    // an ellipsis (a pool worker's is a 56-character key; the whole of it
    // in the tooltip).
    const who = el("td", { class: "node", title: n.name + (n.host ? " on " + n.host : "") },
      n.host ? el("b", { class: "host" }, n.host) : "", el("span", { class: "key" }, n.name), n.draining ? " (draining)" : "");
    return el("tr", { "data-node": n.name }, who,
      el("td", { class: "models" }, models), el("td", {}, bar, pct(n.load)),
      el("td", {}, n.in_flight + " / " + n.capacity), el("td", { class: "heartbeat" }, age(n.sent_at)));
  }), "no live node", 5);

  const tc = v.types || {};
  const types = [...new Set(Object.keys(tc).concat(Object.keys(v.backlog || {}).filter(t => v.backlog[t] > 0)))].sort();
  fillBody("#types", types.map(t => {
    const x = tc[t] || {};
    return el("tr", { "data-type": t }, el("td", {}, t), el("td", {}, x.succeeded || 0), el("td", {}, x.failed || 0),
      el("td", {}, x.rejected || 0), el("td", {}, x.cancelled || 0), el("td", { class: "waiting" }, (v.backlog || {})[t] || 0));
  }), "no task yet", 6);

  fillBody("#dispatchers", (v.replicas || []).map(r => el("tr", { "data-replica": r.name }, el("td", {}, r.name),
    el("td", {}, r.store), el("td", { class: r.degraded ? "breaker-open" : "" }, r.degraded ? "DEGRADED" : "normal"),
    el("td", {}, ago(r.snapshot_at)))), "no dispatcher answered", 4);

  document.getElementById("dlq-total").textContent = "(" + (v.dead_letters_total || 0) + " stored)";
  fillBody("#deadletters", (v.dead_letters || []).map(d => {
    const replay = el("button", { class: "action replay", "data-seq": d.seq, title: "needs the token" }, "replay");
    replay.addEventListener("click", () => act("/api/dlq/replay", { seq: d.seq }));
    return el("tr", { "data-seq": d.seq }, el("td", {}, d.seq),
      el("td", {}, ago(d.at)), el("td", {}, d.kind), el("td", {}, d.task_id || "-"), el("td", {}, d.code || "-"),
      el("td", { class: "reason" }, d.reason), el("td", {}, d.task_id ? replay : ""));
  }), "none", 7);

  const models = [...new Set(state.history.flatMap(p => Object.keys(p.models || {})))].sort();
  document.getElementById("legend").replaceChildren(...models.map(m =>
    el("span", { class: "legend-item", "data-model": m }, el("span", { class: "swatch", style: "background:" + color(m) }), m)));

  chart("chart-success", "success", () => 1, pct);
  chart("chart-p50", "p50", max => max, ms);
  chart("chart-p95", "p95", max => max, ms);
  chart("chart-share", "share", () => 1, pct);
}

// chart draws one line per model over the history as inline SVG.
function chart(id, key, top, fmt) {
  const svg = document.getElementById(id);
  const W = Math.max(200, svg.clientWidth || 400), H = Math.max(80, svg.clientHeight || 140);
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  const pad = { l: 44, r: 6, t: 6, b: 16 };
  const h = state.history;
  const ns = "http://www.w3.org/2000/svg";
  const parts = [];
  let max = 0;
  for (const p of h) for (const m of Object.values(p.models || {})) max = Math.max(max, m[key] || 0);
  const yMax = top(max) || 1;
  const t0 = h.length ? new Date(h[0].at).getTime() : 0, t1 = h.length ? new Date(h[h.length - 1].at).getTime() : 1;
  const x = t => pad.l + (W - pad.l - pad.r) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  const y = val => H - pad.b - (H - pad.t - pad.b) * Math.min(1, val / yMax);
  for (const f of [0, 0.5, 1]) {
    const line = document.createElementNS(ns, "line");
    line.setAttribute("class", "grid");
    line.setAttribute("x1", pad.l); line.setAttribute("x2", W - pad.r);
    line.setAttribute("y1", y(f * yMax)); line.setAttribute("y2", y(f * yMax));
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", 2); label.setAttribute("y", y(f * yMax) + 3);
    label.textContent = fmt(f * yMax) === "-" ? "0" : fmt(f * yMax);
    parts.push(line, label);
  }
  if (h.length > 1) { // time axis: the first, middle and last gathers' clock times
    for (const [f, anchor] of [[0, "start"], [0.5, "middle"], [1, "end"]]) {
      const tx = document.createElementNS(ns, "text");
      tx.setAttribute("class", "axis");
      tx.setAttribute("x", pad.l + f * (W - pad.l - pad.r)); tx.setAttribute("y", H - 3);
      tx.setAttribute("text-anchor", anchor);
      tx.textContent = new Date(t0 + f * (t1 - t0)).toLocaleTimeString([], { hour12: false });
      parts.push(tx);
    }
  }
  const models = new Set();
  for (const p of h) for (const m of Object.keys(p.models || {})) models.add(m);
  for (const m of [...models].sort()) {
    const pts = [];
    for (const p of h) {
      const v = (p.models || {})[m];
      if (v && v[key] !== undefined) pts.push(x(new Date(p.at).getTime()).toFixed(1) + "," + y(v[key]).toFixed(1));
    }
    if (!pts.length) continue;
    if (pts.length === 1) pts.push(pts[0]);
    const pl = document.createElementNS(ns, "polyline");
    pl.setAttribute("points", pts.join(" "));
    pl.setAttribute("stroke", color(m));
    pl.setAttribute("data-model", m);
    parts.push(pl);
  }
  svg.replaceChildren(...parts);
}

const maxHistory = 600;
function push(point) {
  if (!point) return;
  state.history.push(point);
  if (state.history.length > maxHistory) state.history.splice(0, state.history.length - maxHistory);
}

function onSnapshot(data) {
  state.view = data.view;
  state.history = data.history || [];
  render();
}
function onUpdate(data) {
  state.view = data.view;
  push(data.point);
  render();
}

function poll() {
  fetch("/api/view").then(r => r.ok ? r.json() : Promise.reject(new Error("HTTP " + r.status)))
    .then(onSnapshot)
    .catch(() => { const s = document.getElementById("status"); s.textContent = "disconnected"; s.className = "badge bad"; })
    .finally(() => setTimeout(poll, 2000));
}

function connect() {
  if (!window.EventSource) { poll(); return; }
  const es = new EventSource("/api/events");
  es.addEventListener("snapshot", e => onSnapshot(JSON.parse(e.data)));
  es.addEventListener("update", e => onUpdate(JSON.parse(e.data)));
  es.onerror = () => { const s = document.getElementById("status"); s.textContent = "reconnecting…"; s.className = "badge warn"; };
}

// lookup shows a task's result and every attempt (GET /api/task, open).
function lookup(id) {
  if (!id) return;
  fetch("/api/task?id=" + encodeURIComponent(id)).then(r => r.json().then(j => ({ ok: r.ok, j })))
    .then(({ ok, j }) => {
      const box = document.getElementById("lookup-result");
      box.hidden = false;
      const sum = document.getElementById("lookup-summary");
      const out = document.getElementById("lookup-output");
      const body = document.querySelector("#attempts tbody");
      if (!ok) { sum.textContent = j.error || "lookup failed"; sum.dataset.status = "error"; body.replaceChildren(); out.textContent = ""; return; }
      const r = j.result;
      if (!r) {
        sum.textContent = id + ": no result yet (waiting, running, or unknown)"; sum.dataset.status = "none";
        body.replaceChildren(); out.textContent = ""; out.hidden = true; document.getElementById("attempts").hidden = true; return;
      }
      sum.dataset.status = r.status;
      sum.replaceChildren(el("strong", { class: "status-" + r.status }, r.status), " " + r.id + " (" + r.type + ")",
        r.model ? " by " + r.model + " on " + r.node : "", ", " + r.attempts + " attempt(s), " + ms(r.latency_ms) + " end to end",
        r.error ? " — " + (r.error_code ? r.error_code + ": " : "") + r.error : "");
      body.replaceChildren(...(r.history || []).map(a => el("tr", { "data-attempt": a.attempt }, el("td", {}, a.attempt),
        el("td", {}, a.model), el("td", {}, a.node), el("td", {}, a.status), el("td", {}, ms(a.latency_ms)),
        el("td", { class: "reason" }, a.error || ""))));
      // A pipeline's steps (docs/protocol.md#pipelines), one line each.
      const steps = document.getElementById("lookup-steps");
      steps.textContent = (r.steps || []).map((s, i) => "step " + (i + 1) + " " + (s.ensemble ? s.ensemble + "/" : "") + s.name +
        " (" + s.type + "): " + s.status + (s.model ? " by " + s.model + " on " + s.node : "") + ", " + s.attempts + " attempt(s), " +
        ms(s.latency_ms) + (s.error ? " — " + s.error : "")).join("\n") + (r.failed_step ? "\nfailed at step " + r.failed_step : "");
      steps.hidden = steps.textContent === "";
      out.textContent = r.output !== undefined ? "output: " + JSON.stringify(r.output) : "";
      out.hidden = out.textContent === "";
      document.getElementById("attempts").hidden = !(r.history || []).length;
    })
    .catch(e => { const sum = document.getElementById("lookup-summary"); document.getElementById("lookup-result").hidden = false; sum.textContent = "lookup failed: " + e; });
}

// act runs an action (POST, with the token), then shows its answer.
function act(path, body) {
  const token = document.getElementById("token").value;
  sessionStorage.setItem("mlsched-token", token);
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = "Bearer " + token;
  fetch(path, { method: "POST", headers, body: JSON.stringify(body) })
    .then(r => r.json().then(j => ({ ok: r.ok, status: r.status, j })))
    .then(({ ok, status, j }) => {
      const m = document.getElementById("action-msg");
      m.hidden = false; m.className = "msg " + (ok ? "ok" : "bad"); m.dataset.status = String(status);
      m.textContent = (ok ? "" : "refused (" + status + "): ") + (j.message || "");
      if (ok && body.id) lookup(body.id);
    })
    .catch(err => { // no answer, or not JSON: say so rather than nothing
      const m = document.getElementById("action-msg");
      m.hidden = false; m.className = "msg bad"; m.dataset.status = "error";
      m.textContent = "failed: " + err;
    });
}

document.getElementById("token").value = sessionStorage.getItem("mlsched-token") || "";
document.getElementById("lookup-form").addEventListener("submit", e => { e.preventDefault(); lookup(document.getElementById("lookup-id").value.trim()); });
document.getElementById("cancel-task").addEventListener("click", () => {
  const id = document.getElementById("lookup-id").value.trim();
  if (id) act("/api/cancel", { id, reason: "cancelled from the dashboard" });
});

window.addEventListener("resize", render);
connect();
