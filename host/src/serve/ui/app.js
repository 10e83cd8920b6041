// The wasmproc console: one page over the server's /v1 API. The tenant's token is kept
// in this tab's sessionStorage and sent as a bearer token; it never goes in a URL. Text
// from workflows (ids, inputs, logs, results) is only ever set as text, never as markup.
"use strict";

const TOKEN_KEY = "wasmproc.token";
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";

/** An element with attributes and children (strings become text nodes). */
function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function status(text, error) {
  const s = $("status");
  s.textContent = text || "";
  s.classList.toggle("error", !!error);
}

class ApiError extends Error {
  constructor(statusCode, code, message) {
    super(message);
    this.status = statusCode;
    this.code = code;
  }
}

/** A request to the API with the tab's token; JSON back, or an ApiError. */
async function api(path, options = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = Object.assign({ Authorization: "Bearer " + token }, options.headers || {});
  if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(options.json);
  }
  const response = await fetch(path, { method: options.method || "GET", headers, body: options.body, signal: options.signal });
  if (options.raw) return response;
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (!response.ok) {
    const error = body && body.error ? body.error : { code: "http_" + response.status, message: text || response.statusText };
    if (response.status === 401) signOut("The server refused the token: " + error.message);
    throw new ApiError(response.status, error.code, error.message);
  }
  return body;
}

function when(ms) {
  if (ms === null || ms === undefined) return "";
  const d = new Date(ms);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 86400) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}

function shortHash(hash) {
  return hash && hash.startsWith("sha256:") ? hash.slice(0, 19) + "…" : hash || "";
}

function describeWait(w) {
  switch (w.for) {
    case "timer": return "timer until " + when(w.until_ms);
    case "command": return "command " + w.command;
    case "exit": return "exit of process " + w.pid;
    case "child": return w.children + " running child" + (w.children === 1 ? "" : "ren");
    default: return w.for;
  }
}

function stateCell(state) {
  return el("span", { class: "state state-" + state, text: state });
}

function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

// ---------------------------------------------------------------- views and routing

/** What the current view polls and streams; stopped when the view changes. */
const view = { timers: [], aborts: [], name: "" };

function leaveView() {
  view.timers.forEach(clearInterval);
  view.aborts.forEach((a) => a.abort());
  view.timers = [];
  view.aborts = [];
}

function every(ms, work) {
  view.timers.push(setInterval(work, ms));
}

function show(section) {
  for (const id of ["login", "workflows", "workflow", "host"]) $(id).hidden = id !== section;
  for (const [link, name] of [["nav-workflows", "workflows"], ["nav-host", "host"]]) {
    if (name === section || (section === "workflow" && name === "workflows")) $(link).setAttribute("aria-current", "page");
    else $(link).removeAttribute("aria-current");
  }
  view.name = section;
}

function route() {
  leaveView();
  status("");
  if (!sessionStorage.getItem(TOKEN_KEY)) {
    show("login");
    $("who").hidden = true;
    $("token").focus();
    return;
  }
  $("who").hidden = false;
  const hash = location.hash.slice(1) || "/workflows";
  const [path, search] = hash.split("?");
  const params = new URLSearchParams(search || "");
  if (path.startsWith("/workflow/")) {
    show("workflow");
    openWorkflow(decodeURIComponent(path.slice("/workflow/".length)));
  } else if (path === "/host") {
    show("host");
    openHost();
  } else {
    show("workflows");
    openWorkflows(params);
  }
}

function signOut(why) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearShown();
  cursors = [];
  leaveView();
  route();
  if (why) $("login-error").textContent = why;
}

async function signIn(event) {
  event.preventDefault();
  const token = $("token").value.trim();
  $("login-error").textContent = "";
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token").value = "";
  try {
    await api("/v1/workflow-counts");
  } catch (error) {
    if (error.status !== 401) signOut("Cannot sign in: " + error.message);
    return;
  }
  $("who-name").textContent = "Signed in";
  if (!location.hash || location.hash === "#") location.hash = "#/workflows";
  else route();
  $("main").focus();
}

// ---------------------------------------------------------------- the workflows table

/** The cursors of the pages before this one (`after=` of each), for Previous. */
let cursors = [];
let firstRender = false;

function filterParams(params) {
  const out = new URLSearchParams();
  for (const key of ["state", "component", "prefix", "limit"]) {
    const value = params.get(key);
    if (value) out.set(key, value);
  }
  return out;
}

function openWorkflows(params) {
  $("f-state").value = params.get("state") || "";
  $("f-component").value = params.get("component") || "";
  $("f-prefix").value = params.get("prefix") || "";
  $("f-limit").value = params.get("limit") || "50";
  const after = params.get("after") || "";
  const load = () => loadWorkflows(params, after);
  load();
  every(5000, () => { if ($("f-live").checked && !document.hidden) load(); });
}

async function loadWorkflows(params, after) {
  const filters = filterParams(params);
  const query = new URLSearchParams(filters);
  if (!query.has("limit")) query.set("limit", "50");
  if (after) query.set("after", after);
  query.set("progress", "true");
  const countQuery = new URLSearchParams();
  for (const key of ["component", "prefix"]) if (filters.get(key)) countQuery.set(key, filters.get(key));
  // The rows first, the counts when they come: a filtered count reads the workflows
  // the filter selects (up to the server's bound), a page only the first of them.
  const counted = api("/v1/workflow-counts" + (countQuery.toString() ? "?" + countQuery : ""))
    .then((counts) => { if (view.name === "workflows") renderCounts(counts, filters); })
    .catch((error) => status("Cannot count workflows: " + error.message, true));
  try {
    const page = await api("/v1/workflows?" + query);
    if (view.name !== "workflows") return;
    renderRows(page.workflows, page.partial);
    const pageNo = cursors.length + 1;
    $("page-label").textContent = "Page " + pageNo + (page.workflows.length ? "" : " (empty)") +
      (page.partial ? " — " + page.examined.toLocaleString("en") + " read, Next reads on" : "");
    $("prev").disabled = !after;
    $("first").disabled = !after;
    const next = $("next");
    next.disabled = !page.next;
    next.dataset.after = page.next || "";
    if (!firstRender) {
      firstRender = true;
      performance.mark("wasmproc:first-render");
    }
    await counted;
    $("workflows").dataset.loaded = String(Number($("workflows").dataset.loaded || 0) + 1);
  } catch (error) {
    status("Cannot list workflows: " + error.message, true);
  }
}

function renderCounts(counts, filters) {
  const list = $("counts");
  const current = filters.get("state") || "";
  const total = counts.running + counts.completed + counts.failed;
  // Inexact: the counts of the first workflows a filter selects, as many as the server
  // reads for one request, so each is at least the number shown.
  const more = counts.exact ? "" : "+";
  list.replaceChildren(
    ...[["", "all", total], ["running", "running", counts.running], ["completed", "completed", counts.completed],
      ["failed", "failed", counts.failed]].map(([state, label, n]) =>
      el("li", {}, el("button", {
        type: "button", "aria-pressed": String(current === state), "data-state": label, "data-count": n,
        onclick: () => {
          const f = filterParams(new URLSearchParams(location.hash.split("?")[1] || ""));
          if (state) f.set("state", state); else f.delete("state");
          cursors = [];
          location.hash = "#/workflows?" + f;
        },
      }, label + ": " + n.toLocaleString("en") + more)),
    ),
  );
}

function renderRows(workflows, partial) {
  const rows = workflows.map((w) => {
    const waiting = w.state === "running" ? (w.waiting || []).map(describeWait).join("; ") : "";
    return el("tr", { "data-id": w.id },
      el("th", { scope: "row" }, el("a", { href: "#/workflow/" + encodeURIComponent(w.id), text: w.id })),
      el("td", {}, stateCell(w.state)),
      el("td", {}, el("code", { title: w.component, text: shortHash(w.component) }), " ", w.method),
      el("td", {}, el("time", { datetime: new Date(w.started_ms).toISOString(), title: when(w.started_ms), text: ago(w.started_ms) })),
      el("td", { class: "num", text: w.steps === undefined ? "" : String(w.steps) }),
      el("td", { text: waiting }),
    );
  });
  if (!rows.length) {
    const none = partial ? "None match among those read so far: Next reads on." : "No workflows match.";
    rows.push(el("tr", {}, el("td", { colspan: 6, text: none })));
  }
  $("wf-rows").replaceChildren(...rows);
}

function onFilter(event) {
  event.preventDefault();
  const f = new URLSearchParams();
  for (const [key, id] of [["state", "f-state"], ["component", "f-component"], ["prefix", "f-prefix"], ["limit", "f-limit"]]) {
    const value = $(id).value.trim();
    if (value && !(key === "limit" && value === "50")) f.set(key, value);
  }
  cursors = [];
  location.hash = "#/workflows" + (f.toString() ? "?" + f : "");
}

function page(direction) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const f = filterParams(params);
  if (direction === "next") {
    cursors.push(params.get("after") || "");
    f.set("after", $("next").dataset.after);
  } else if (direction === "prev") {
    const before = cursors.pop() || "";
    if (before) f.set("after", before);
  } else {
    cursors = [];
  }
  location.hash = "#/workflows" + (f.toString() ? "?" + f : "");
}

// ---------------------------------------------------------------- one workflow

/**
 * A record's line as the history endpoint gives it (`journal show`'s), read back into
 * its parts: `seq kind time body`, a step's body `events → sends … → commands → status`.
 */
function parseRecord(line) {
  const m = /^\s*(\d+)\s+(spawn|step|exit|host)\s+(.*)$/.exec(line);
  if (!m) return { seq: null, kind: "?", text: line };
  const record = { seq: Number(m[1]), kind: m[2], text: line, events: "", commands: [], sends: [], then: "" };
  let rest = m[3];
  const date = /^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) UTC\s+/.exec(rest);
  const delta = /^\+([\d.]+) (µs|ms|s)\s+/.exec(rest);
  if (date) {
    record.atMicros = Date.parse(date[1].replace(" ", "T").slice(0, 23) + "Z") * 1000 + Number(date[1].slice(23, 26) || 0);
    rest = rest.slice(date[0].length);
  } else if (delta) {
    record.afterMicros = Number(delta[1]) * { "µs": 1, ms: 1e3, s: 1e6 }[delta[2]];
    rest = rest.slice(delta[0].length);
  }
  if (record.kind === "step") {
    const parts = rest.split(" → ");
    record.then = parts.length > 1 ? parts.pop() : "";
    record.events = parts.shift() || "";
    for (const part of parts) {
      if (part.startsWith("sends ")) record.sends.push(...part.slice(6).split("; "));
      else record.commands.push(...part.split("; "));
    }
  } else {
    record.events = rest;
  }
  return record;
}

/** Each process's records with their times, the timers and the messages between them. */
function readHistory(history) {
  const lanes = history.processes.map((p) => {
    let at = null;
    const records = p.records.map((line) => {
      const r = parseRecord(line);
      if (r.atMicros !== undefined) at = r.atMicros;
      else if (r.afterMicros !== undefined && at !== null) at += r.afterMicros;
      r.at = at;
      return r;
    });
    return { process: p, records };
  });
  const timers = [];
  const messages = [];
  const sent = new Map();
  for (const lane of lanes) {
    const pending = new Map();
    for (const r of lane.records) {
      if (r.kind !== "step") continue;
      for (const c of r.commands) {
        const sleep = /^(\d+): sleep (.*)$/.exec(c);
        if (sleep) pending.set(sleep[1], { from: r.at, label: sleep[2] });
      }
      for (const done of r.events.matchAll(/completion (\d+):/g)) {
        const timer = pending.get(done[1]);
        if (timer) {
          timers.push({ pid: lane.process.pid, from: timer.from, to: r.at, label: "sleep " + timer.label });
          pending.delete(done[1]);
        }
      }
      if (r.sends.length || r.commands.some((c) => /: send /.test(c))) sent.set(lane.process.pid + ":" + r.seq, r.at);
    }
    for (const timer of pending.values()) timers.push({ pid: lane.process.pid, from: timer.from, to: null, label: "sleep " + timer.label });
  }
  for (const lane of lanes) {
    for (const r of lane.records) {
      for (const got of r.events.matchAll(/message ("(?:[^"\\]|\\.)*") .*? from (\d+) \(sender's record (\d+)\)/g)) {
        const from = Number(got[2]);
        messages.push({ from, to: lane.process.pid, sentAt: sent.get(from + ":" + got[3]), at: r.at, topic: got[1] });
      }
    }
  }
  return { lanes, timers, messages };
}

function renderTree(history, workflow) {
  const byParent = new Map();
  const pids = new Set(history.processes.map((p) => p.pid));
  for (const p of history.processes) {
    const parent = p.parent !== null && pids.has(p.parent) && p.pid !== workflow.pid ? p.parent : "root";
    if (!byParent.has(parent)) byParent.set(parent, []);
    byParent.get(parent).push(p);
  }
  const relations = (p) => {
    const notes = [];
    for (const line of p.records) {
      for (const m of line.matchAll(/\d+: (link|monitor|unlink|demonitor) (\d+)/g)) notes.push(m[1] + " " + m[2]);
      const spawned = /\d+: spawn .*?(, monitored)?(, linked)?(?: →|;|$)/.exec(line);
      if (spawned && (spawned[1] || spawned[2])) notes.push("spawned a child" + (spawned[1] || "") + (spawned[2] || ""));
    }
    return notes;
  };
  const item = (p) => {
    const state = p.ended ? p.ended.reason : "running";
    const notes = relations(p);
    const children = byParent.get(p.pid) || [];
    return el("li", { "data-pid": p.pid },
      el("span", { class: "pid", text: "process " + p.pid }), " ",
      el("code", { title: p.kind || "", text: shortHash(p.kind || "") }), " ", p.method + "()",
      " · ", p.steps + " step" + (p.steps === 1 ? "" : "s"), " · ",
      el("span", { class: "state state-" + (p.ended ? (p.ended.reason === "normal" ? "completed" : "failed") : "running"), text: state }),
      p.waiting_for.length ? el("span", { class: "note", text: " · waits for " + p.waiting_for.join("; ") }) : null,
      notes.length ? el("span", { class: "note", text: " · " + notes.join(", ") }) : null,
      children.length ? el("ul", {}, children.map(item)) : null,
    );
  };
  const roots = byParent.get("root") || [];
  $("wf-tree").replaceChildren(...(roots.length ? roots.map(item) : [el("li", { text: "No processes in the journal." })]));
}

function renderTimeline(read) {
  const all = read.lanes.flatMap((l) => l.records.map((r) => r.at)).filter((t) => t !== null);
  const chart = $("wf-chart");
  if (!all.length) {
    chart.replaceChildren(el("p", { text: "No records." }));
    return;
  }
  const start = Math.min(...all);
  const now = Date.now() * 1000;
  const end = Math.max(...all, ...read.timers.map((t) => (t.to === null ? Math.min(now, start + 36e8) : t.to)));
  const span = Math.max(end - start, 1000);
  const left = 150, width = Math.max(600, Math.min(1400, chart.clientWidth || 900)) - left - 20, laneH = 34;
  const x = (t) => left + ((t - start) / span) * width;
  const laneOf = new Map(read.lanes.map((l, i) => [l.process.pid, i]));
  const y = (pid) => 24 + laneOf.get(pid) * laneH;
  const svg = el("svg:svg", {
    width: left + width + 20, height: 34 + read.lanes.length * laneH, role: "img",
    "aria-label": "Timeline of " + read.lanes.length + " processes over " + fmtMicros(span),
  });
  for (let i = 0; i <= 4; i++) {
    const t = start + (span * i) / 4;
    svg.append(el("svg:text", { x: x(t), y: 12, class: "tl-axis", "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" },
      i === 0 ? "0" : "+" + fmtMicros(t - start)));
  }
  for (const lane of read.lanes) {
    const ly = y(lane.process.pid);
    svg.append(el("svg:line", { x1: left, x2: left + width, y1: ly + 10, y2: ly + 10, class: "tl-lane" }));
    svg.append(el("svg:text", { x: 4, y: ly + 14, class: "tl-label" }, "process " + lane.process.pid));
  }
  for (const t of read.timers) {
    const to = t.to === null ? end : t.to;
    svg.append(el("svg:rect", { x: x(t.from), y: y(t.pid) + 14, width: Math.max(2, x(to) - x(t.from)), height: 6, class: "tl-timer" },
      el("svg:title", {}, t.label + (t.to === null ? " (pending)" : ", fired after " + fmtMicros(t.to - t.from)))));
  }
  for (const lane of read.lanes) {
    let previous = null;
    for (const r of lane.records) {
      if (r.at === null) continue;
      const after = previous === null ? "" : " (+" + fmtMicros(r.at - previous) + ")";
      previous = r.at;
      const cls = r.kind === "exit" ? "tl-exit" : "tl-step";
      svg.append(el("svg:rect", { x: x(r.at) - 2, y: y(lane.process.pid) + 2, width: 4, height: 16, class: cls },
        el("svg:title", {}, "process " + lane.process.pid + " record " + r.seq + " " + r.kind + after + ": " + r.events +
          (r.commands.length ? " → " + r.commands.join("; ") : "") + (r.then ? " → " + r.then : ""))));
    }
  }
  for (const m of read.messages) {
    if (!laneOf.has(m.from) || m.at === null) continue;
    const from = m.sentAt === undefined ? m.at : m.sentAt;
    svg.append(el("svg:line", { x1: x(from), y1: y(m.from) + 10, x2: x(m.at), y2: y(m.to) + 10, class: "tl-msg" },
      el("svg:title", {}, "message " + m.topic + " from process " + m.from + " to process " + m.to)));
  }
  chart.replaceChildren(svg);
  const rows = [];
  for (const lane of read.lanes) {
    let previous = null;
    for (const r of lane.records) {
      const after = previous !== null && r.at !== null ? "+" + fmtMicros(r.at - previous) : r.at !== null ? when(r.at / 1000) : "";
      if (r.at !== null) previous = r.at;
      rows.push(el("tr", { "data-pid": lane.process.pid },
        el("td", { text: String(lane.process.pid) }), el("td", { class: "num", text: String(r.seq) }),
        el("td", { text: r.kind }), el("td", { text: after }), el("td", { text: r.events }),
        el("td", { text: [...r.commands, ...r.sends.map((s) => "sends " + s)].join("; ") }), el("td", { text: r.then || "" })));
    }
  }
  $("wf-records").tBodies[0].replaceChildren(...rows);
}

function fmtMicros(us) {
  if (us < 1000) return Math.round(us) + " µs";
  if (us < 1e6) return (us / 1e3).toFixed(1) + " ms";
  if (us < 6e7) return (us / 1e6).toFixed(2) + " s";
  return (us / 6e7).toFixed(1) + " min";
}

function fact(term, ...value) {
  return [el("dt", { text: term }), el("dd", {}, ...value)];
}

async function loadWorkflow(id) {
  const path = "/v1/workflows/" + encodeURIComponent(id);
  const [described, history] = await Promise.all([api(path), api(path + "/history")]);
  if (view.name !== "workflow") return null;
  const w = described.workflow;
  $("wf-facts").replaceChildren(
    ...fact("State", el("span", { id: "wf-state", class: "state state-" + w.state, text: w.state })),
    ...fact("Component", el("code", { text: w.component })),
    ...fact("Method", w.method),
    ...fact("Input", el("code", { text: JSON.stringify(w.input) })),
    ...fact("Root process", String(w.pid)),
    ...fact("Started", when(w.started_ms)),
    ...fact("Ended", w.ended_ms ? when(w.ended_ms) + " (after " + fmtMicros((w.ended_ms - w.started_ms) * 1000) + ")" : "—"),
    ...fact("Steps", w.steps === undefined ? "—" : String(w.steps)),
  );
  const waiting = w.state === "running" ? (w.waiting || []).map(describeWait) : [];
  $("wf-waiting").replaceChildren(...(waiting.length ? waiting : [w.state === "running" ? "nothing known" : "nothing: it has ended"])
    .map((text) => el("li", { text })));
  let result = "— (running)";
  if (w.result && "ok" in w.result) result = "ok: " + JSON.stringify(w.result.ok, null, 2);
  else if (w.result && w.result.error) result = "error (" + w.result.error.reason + "): " + w.result.error.message;
  $("wf-result").textContent = result;
  for (const id of ["signal", "cancel", "terminate"]) $(id).disabled = w.state !== "running";
  renderTree(history, w);
  renderTimeline(readHistory(history));
  $("workflow").dataset.loaded = String(Number($("workflow").dataset.loaded || 0) + 1);
  return w;
}

/** Empties what a view showed, so nothing of one workflow or one token is left for the next. */
function clearShown() {
  for (const id of ["wf-facts", "wf-waiting", "wf-tree", "wf-chart", "wf-rows", "counts", "host-facts", "host-charts"]) {
    $(id).replaceChildren();
  }
  for (const id of ["wf-result", "wf-logs", "page-label"]) $(id).textContent = "";
  $("wf-records").tBodies[0].replaceChildren();
  $("workers").tBodies[0].replaceChildren();
  for (const id of ["workflows", "workflow", "host"]) delete $(id).dataset.loaded;
  samples.length = 0;
}

function openWorkflow(id) {
  clearShown();
  $("wf-id").textContent = id;
  $("workflow").dataset.id = id;
  $("wf-logs").textContent = "";
  let running = true;
  const load = async () => {
    try {
      const w = await loadWorkflow(id);
      if (w) running = w.state === "running";
    } catch (error) {
      status((error.status === 404 ? "No workflow " : "Cannot read workflow ") + id + ": " + error.message, true);
    }
  };
  load().then(() => {
    followLogs(id);
    every(3000, () => { if (running && !document.hidden) load(); });
  });
}

/** The workflow's log: its lines, then (when following) new ones as they come, at most 2,000 kept. */
async function followLogs(id) {
  const abort = new AbortController();
  view.aborts.push(abort);
  const out = $("wf-logs");
  const follow = $("logs-follow").checked;
  const lines = [];
  const shown = (entry) => {
    if (entry.message === undefined) return JSON.stringify(entry);
    if (entry.pid === undefined) return "[" + Object.keys(entry).find((k) => k !== "message") + "] " + entry.message;
    return when(entry.ms) + " " + entry.pid + " " + entry.source + ": " + entry.message;
  };
  try {
    const response = await api("/v1/workflows/" + encodeURIComponent(id) + "/logs" + (follow ? "?follow=true" : ""), { raw: true, signal: abort.signal });
    if (!response.ok) return;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let partial = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      partial += decoder.decode(value, { stream: true });
      const complete = partial.split("\n");
      partial = complete.pop();
      for (const text of complete) {
        if (!text) continue;
        try { lines.push(shown(JSON.parse(text))); } catch (_) { lines.push(text); }
      }
      if (lines.length > 2000) lines.splice(0, lines.length - 2000);
      const atEnd = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      out.textContent = lines.join("\n");
      if (atEnd) out.scrollTop = out.scrollHeight;
    }
    if (!lines.length) out.textContent = "(no log lines)";
  } catch (error) {
    if (error.name !== "AbortError") status("Cannot read the logs: " + error.message, true);
  }
}

/** Asks `question` in the confirmation dialog; true if the user says yes. */
function confirmAction(question) {
  const dialog = $("confirm");
  $("confirm-text").textContent = question;
  return new Promise((resolve) => {
    const done = (yes) => {
      $("confirm-yes").onclick = $("confirm-no").onclick = dialog.oncancel = null;
      dialog.close();
      resolve(yes);
    };
    $("confirm-yes").onclick = () => done(true);
    $("confirm-no").onclick = () => done(false);
    dialog.oncancel = () => done(false);
    dialog.showModal();
    $("confirm-no").focus();
  });
}

async function act(what, event) {
  if (event) event.preventDefault();
  const id = $("workflow").dataset.id;
  const path = "/v1/workflows/" + encodeURIComponent(id) + "/" + what;
  let options = { method: "POST" };
  let question = what === "cancel"
    ? "Cancel workflow “" + id + "”? It gets a cancel event, and is terminated if it has not ended after the server's grace."
    : "Terminate workflow “" + id + "” now? It ends at once, without running its cleanup.";
  if (what === "signal") {
    const topic = $("signal-topic").value.trim();
    let body;
    try { body = JSON.parse($("signal-body").value || "null"); } catch (error) {
      status("The signal's body is not JSON: " + error.message, true);
      $("signal-body").focus();
      return;
    }
    options.json = { topic, body };
    question = "Send workflow “" + id + "” a signal on topic “" + topic + "”?";
  }
  if (!(await confirmAction(question))) {
    status("Nothing sent.");
    return;
  }
  try {
    await api(path, options);
    status(what === "signal" ? "Signal sent." : what === "cancel" ? "Cancel sent." : "Terminated.");
    await loadWorkflow(id);
  } catch (error) {
    status("Cannot " + what + ": " + error.message, true);
  }
}

// ---------------------------------------------------------------- the host

const samples = [];
const KEEP = 150;

function openHost() {
  const load = async () => {
    try {
      const figures = await api("/v1/host");
      samples.push(figures);
      if (samples.length > KEEP) samples.splice(0, samples.length - KEEP);
      if (view.name === "host") renderHost();
    } catch (error) {
      status("Cannot read the host: " + error.message, true);
    }
  };
  load();
  every(2000, load);
}

/** The rate of `pick` between the last two samples (a second), or null. */
function rate(pick, i = samples.length - 1) {
  if (i < 1) return null;
  const a = samples[i - 1], b = samples[i];
  const dt = (b.at_ms - a.at_ms) / 1000;
  const da = pick(a), db = pick(b);
  if (dt <= 0 || da === null || db === null || db < da) return null;
  return (db - da) / dt;
}

function renderHost() {
  const h = samples[samples.length - 1];
  const fixed = (v) => (v === null ? "—" : v.toFixed(v < 10 ? 1 : 0));
  $("host-facts").replaceChildren(
    ...fact("Workers", String(h.workers.length)),
    ...fact("Processes alive", h.live.toLocaleString("en") + " (at most " + h.peak_live.toLocaleString("en") + " so far)"),
    ...fact("Your workflows running", h.running.toLocaleString("en")),
    ...fact("In the global queue", String(h.queued)),
    ...fact("Steps", h.steps.toLocaleString("en")),
    ...fact("Hibernations", h.hibernated.toLocaleString("en")),
    ...fact("Suspended now", h.suspended.toLocaleString("en") + " (out of memory until their next event)"),
    ...fact("Journal", h.commits === null ? "none" : h.commits.toLocaleString("en") + " commits, " +
      (h.journal_records || 0).toLocaleString("en") + " records, " + bytes(h.journal_bytes) + " since the server started"),
  );
  const series = [
    ["Steps a second", (s) => s.steps, true],
    ["Commits a second", (s) => s.commits, true],
    ["Messages a second", (s) => s.messages, true],
    ["Journal bytes a second", (s) => s.journal_bytes, true],
    ["Processes alive", (s) => s.live, false],
    ["Your workflows running", (s) => s.running, false],
  ];
  $("host-charts").replaceChildren(...series.map(([title, pick, isRate]) => {
    const values = samples.map((s, i) => (isRate ? rate(pick, i) : pick(s)));
    const last = values[values.length - 1];
    return el("figure", { class: "spark", "data-series": title },
      el("h4", { text: title }),
      el("div", { class: "now", text: last === null || last === undefined ? "—" : isRate ? fixed(last) : last.toLocaleString("en") }),
      sparkline(values, title));
  }));
  const rows = h.workers.map((w, i) => {
    const r = rate((s) => (s.workers[i] ? s.workers[i].steps : null));
    return el("tr", {}, el("th", { scope: "row", text: String(i) }), el("td", { class: "num", text: w.steps.toLocaleString("en") }),
      el("td", { class: "num", text: fixed(r) }), el("td", { text: r === null ? "—" : r > 0 ? "busy" : "parked or idle" }));
  });
  $("workers").tBodies[0].replaceChildren(...rows);
  $("host").dataset.loaded = String(samples.length);
}

function sparkline(values, title) {
  const known = values.filter((v) => v !== null && v !== undefined);
  const max = Math.max(1, ...known);
  const n = Math.max(values.length - 1, 1);
  const points = values.map((v, i) => (v === null || v === undefined ? null : (i / n) * 300 + "," + (46 - (v / max) * 44)))
    .filter(Boolean).join(" ");
  return el("svg:svg", { viewBox: "0 0 300 48", preserveAspectRatio: "none", role: "img",
    "aria-label": title + " over the last " + Math.round((values.length * 2) / 60 * 10) / 10 + " minutes, at most " + max.toFixed(0) },
  el("svg:polyline", { points }));
}

// ---------------------------------------------------------------- wiring

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", signIn);
  $("logout").addEventListener("click", () => signOut(""));
  $("filters").addEventListener("submit", onFilter);
  $("goto").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = $("goto-id").value.trim();
    if (id) location.hash = "#/workflow/" + encodeURIComponent(id);
  });
  $("next").addEventListener("click", () => page("next"));
  $("prev").addEventListener("click", () => page("prev"));
  $("first").addEventListener("click", () => page("first"));
  $("signal-form").addEventListener("submit", (event) => act("signal", event));
  $("cancel").addEventListener("click", () => act("cancel"));
  $("terminate").addEventListener("click", () => act("terminate"));
  $("logs-follow").addEventListener("change", () => {
    view.aborts.forEach((a) => a.abort());
    view.aborts = [];
    followLogs($("workflow").dataset.id);
  });
  window.addEventListener("hashchange", route);
  if (sessionStorage.getItem(TOKEN_KEY)) $("who-name").textContent = "Signed in";
  route();
});
