// The minions console: the runs list, live; a run's steps as a graph, its events as they come
// (Server-Sent Events, through an EventSource opened with a stream ticket: the token stays in
// headers), its outputs, usage and streaming text; cancel, resume, approve, reject. No build
// step, no dependencies.
"use strict";

const TOKEN_KEY = "minions-token";
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const $ = (selector) => document.querySelector(selector);

let token = sessionStorage.getItem(TOKEN_KEY);
let listTimer = null;
let current = null; // the run on screen: {id, source, steps, tokens, lastSeq, ended}

// -- the API ------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, type, message) { super(message); this.status = status; this.type = type; }
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${token}`, ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) { askToken("the token was refused"); throw new ApiError(401, "unauthorized", "the token was refused"); }
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = (body && body.error) || { type: "error", message: response.statusText };
    throw new ApiError(response.status, error.type, error.message);
  }
  return body;
}

// -- the token ----------------------------------------------------------------------------

function askToken(why) {
  token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  stopRun();
  clearInterval(listTimer);
  $("#app").hidden = true;
  $("#forget").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = why || "";
  $("#token").focus();
}

$("#login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  token = $("#token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, token);
  $("#token").value = "";
  await start();
});
$("#forget").addEventListener("click", () => askToken(""));

async function start() {
  try { await api("/runs?limit=1"); } catch (error) { if (error.status === 401) return; }
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#forget").hidden = false;
  await loadRecipes();
  await refreshList();
  clearInterval(listTimer);
  listTimer = setInterval(refreshList, 1000);
  route();
}

// -- the runs list ------------------------------------------------------------------------

const when = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "");
const duration = (r) => (r.started_at ? `${((r.finished_at || Date.now() / 1000) - r.started_at).toFixed(1)}s` : "");
const tokens = (u) => (u && u.calls ? String((u.prompt_tokens || 0) + (u.completion_tokens || 0)) : "");

function statusBadge(status) {
  const span = document.createElement("span");
  span.className = `status s-${status}`;
  span.textContent = status;
  return span;
}

async function loadRecipes() {
  const recipes = await api("/recipes");
  const select = $("#recipe");
  select.replaceChildren(...recipes.map((r) => {
    const option = document.createElement("option");
    option.value = r.id;
    option.textContent = r.description ? `${r.id} — ${r.description}` : r.id;
    return option;
  }));
}

async function refreshList() {
  let page;
  try { page = await api("/runs?limit=50"); } catch { $("#connection").textContent = "disconnected"; return; }
  $("#connection").textContent = "";
  const rows = page.runs.map((r) => {
    const row = document.createElement("tr");
    row.dataset.run = r.run_id;
    const cells = [r.run_id.slice(0, 12), null, r.recipe, when(r.started_at || r.created_at), duration(r), tokens(r.usage)];
    for (const value of cells) {
      const cell = document.createElement("td");
      if (value === null) cell.append(statusBadge(r.status)); else cell.textContent = value;
      row.append(cell);
    }
    row.addEventListener("click", () => { location.hash = `#/runs/${r.run_id}`; });
    return row;
  });
  $("#runs tbody").replaceChildren(...rows);
}

$("#submit-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  $("#submit-error").textContent = "";
  let inputs;
  try { inputs = JSON.parse($("#inputs").value || "{}"); } catch { $("#submit-error").textContent = "inputs: not JSON"; return; }
  try {
    const made = await api("/runs", { method: "POST", body: JSON.stringify({ recipe: $("#recipe").value, inputs }) });
    await refreshList();
    location.hash = `#/runs/${made.run_id}`;
  } catch (error) { $("#submit-error").textContent = error.message; }
});

// -- one run ------------------------------------------------------------------------------

function route() {
  const match = location.hash.match(/^#\/runs\/([^/]+)$/);
  if (match) showRun(match[1]); else { stopRun(); $("#run-view").hidden = true; }
}
window.addEventListener("hashchange", () => { if (token) route(); });

function stopRun() {
  if (current && current.source) current.source.close();
  current = null;
}

async function showRun(runId) {
  stopRun();
  const run = { id: runId, source: null, steps: {}, tokens: {}, lastSeq: 0, ended: false, graph: [] };
  current = run;
  $("#run-view").hidden = false;
  $("#run-id").textContent = runId;
  $("#events").replaceChildren();
  $("#tokens").replaceChildren();
  $("#event-count").textContent = "";
  await refreshRun(run);
  follow(run);
}

async function refreshRun(run) {
  let data;
  try { data = await api(`/runs/${run.id}`); } catch (error) { $("#run-recipe").textContent = error.message; return; }
  if (current !== run) return;
  run.graph = data.graph;
  $("#run-status").replaceWith(Object.assign(statusBadge(data.status), { id: "run-status" }));
  $("#run-recipe").textContent = data.recipe;
  const u = data.usage || {};
  $("#run-usage").textContent = u.calls ? `${u.calls} model calls, ${u.prompt_tokens || 0}+${u.completion_tokens || 0} tokens` : "";
  $("#cancel").disabled = TERMINAL.has(data.status);
  $("#resume").disabled = !(data.status === "failed" || data.status === "cancelled");
  $("#run-output").textContent = data.output === null ? (data.error || "") : JSON.stringify(data.output, null, 2);
  for (const step of data.steps) run.steps[step.step_id] = { ...(run.steps[step.step_id] || {}), status: step.status, record: step };
  renderSteps(run);
  renderApprovals(run, data.approvals.filter((a) => a.decided_at === null));
}

function renderApprovals(run, waiting) {
  const boxes = waiting.map((a) => {
    const box = document.createElement("div");
    box.className = "approval";
    box.dataset.call = a.call_id;
    const what = document.createElement("span");
    what.textContent = `step ${a.step_id} wants to call ${a.tool}(${JSON.stringify(a.arguments)})`;
    const approve = Object.assign(document.createElement("button"), { type: "button", className: "approve", textContent: "approve" });
    const reason = Object.assign(document.createElement("input"), { placeholder: "reason (for a rejection)", className: "reason" });
    const reject = Object.assign(document.createElement("button"), { type: "button", className: "reject", textContent: "reject" });
    const decide = async (yes) => {
      const body = yes ? { approve: true } : { approve: false, reason: reason.value || null };
      try { await api(`/runs/${run.id}/approvals/${encodeURIComponent(a.call_id)}`, { method: "POST", body: JSON.stringify(body) }); }
      catch (error) { what.textContent = error.message; }
      await refreshRun(run);
    };
    approve.addEventListener("click", () => decide(true));
    reject.addEventListener("click", () => decide(false));
    box.append(what, approve, reason, reject);
    return box;
  });
  $("#approvals").replaceChildren(...boxes);
}

$("#cancel").addEventListener("click", async () => { if (current) { try { await api(`/runs/${current.id}/cancel`, { method: "POST" }); } catch {} await refreshRun(current); } });
$("#resume").addEventListener("click", async () => {
  if (!current) return;
  const run = current;
  try { await api(`/runs/${run.id}/resume`, { method: "POST" }); } catch {}
  await refreshRun(run);
  if (run.ended) { run.ended = false; follow(run); }
});

// -- the graph ----------------------------------------------------------------------------

function renderSteps(run) {
  const nodes = run.graph;
  const level = {};
  const depth = (id, seen = new Set()) => {
    if (level[id] !== undefined) return level[id];
    if (seen.has(id)) return 0;
    seen.add(id);
    const node = nodes.find((n) => n.id === id);
    const parents = [...(node ? node.depends_on : []), ...nodes.filter((n) => n.next.includes(id) && !seen.has(n.id)).map((n) => n.id)];
    level[id] = parents.length ? Math.max(...parents.map((p) => depth(p, seen) + 1)) : 0;
    return level[id];
  };
  nodes.forEach((n) => depth(n.id));
  const columns = {};
  nodes.forEach((n) => { (columns[level[n.id]] = columns[level[n.id]] || []).push(n.id); });
  const W = 130, H = 34, GX = 40, GY = 16;
  const place = {};
  Object.entries(columns).forEach(([col, ids]) => ids.forEach((id, row) => { place[id] = { x: 10 + col * (W + GX), y: 10 + row * (H + GY) }; }));
  const svg = $("#graph");
  const ns = "http://www.w3.org/2000/svg";
  const parts = [];
  for (const n of nodes) {
    for (const target of [...n.next]) if (place[target]) parts.push(edge(place[n.id], place[target]));
    for (const source of n.depends_on) if (place[source]) parts.push(edge(place[source], place[n.id]));
  }
  function edge(a, b) {
    const line = document.createElementNS(ns, "line");
    line.setAttribute("x1", a.x + W); line.setAttribute("y1", a.y + H / 2);
    line.setAttribute("x2", b.x); line.setAttribute("y2", b.y + H / 2);
    return line;
  }
  for (const n of nodes) {
    const status = (run.steps[n.id] && run.steps[n.id].status) || "pending";
    const g = document.createElementNS(ns, "g");
    g.setAttribute("class", `node n-${status}`);
    g.dataset.step = n.id;
    g.dataset.status = status;
    const rect = document.createElementNS(ns, "rect");
    rect.setAttribute("x", place[n.id].x); rect.setAttribute("y", place[n.id].y);
    rect.setAttribute("width", W); rect.setAttribute("height", H);
    const text = document.createElementNS(ns, "text");
    text.setAttribute("x", place[n.id].x + 8); text.setAttribute("y", place[n.id].y + H / 2 + 4);
    text.textContent = `${n.id} · ${status}`;
    const title = document.createElementNS(ns, "title");
    title.textContent = `${n.kind} step ${n.id}: ${status}`;
    g.append(rect, text, title);
    parts.push(g);
  }
  const cols = Object.keys(columns).length, rows = Math.max(1, ...Object.values(columns).map((c) => c.length));
  svg.setAttribute("viewBox", `0 0 ${Math.max(1, cols) * (W + GX) + 20} ${rows * (H + GY) + 20}`);
  svg.style.height = `${rows * (H + GY) + 20}px`;
  svg.replaceChildren(...parts);
  const rowsOut = nodes.map((n) => {
    const step = run.steps[n.id] || {};
    const record = step.record || {};
    const row = document.createElement("tr");
    row.dataset.step = n.id;
    const u = record.usage || {};
    const output = record.output === undefined ? "" : (typeof record.output === "string" ? record.output : JSON.stringify(record.output));
    const cells = [n.id, null, u.calls ? String((u.prompt_tokens || 0) + (u.completion_tokens || 0)) : "", record.error || output];
    for (const value of cells) {
      const cell = document.createElement("td");
      if (value === null) cell.append(statusBadge(step.status || "pending")); else cell.textContent = value;
      row.append(cell);
    }
    return row;
  });
  $("#steps tbody").replaceChildren(...rowsOut);
}

// -- the event stream ---------------------------------------------------------------------

const STEP_STATUS = { step_started: "running", approval_requested: "waiting", approval_resolved: "running", step_completed: "completed", step_failed: "failed", step_skipped: "skipped" };
const REFRESH_ON = new Set(["step_completed", "step_failed", "step_skipped", "approval_requested", "approval_resolved", "run_completed", "run_failed", "run_started"]);

const KINDS = ["run_started", "run_completed", "run_failed", "step_started", "step_completed", "step_failed", "step_skipped", "model_call_started", "model_call_completed", "model_call_failed", "token_delta", "tool_call_started", "tool_call_completed", "tool_call_failed", "retry_scheduled", "output_mode_demoted", "approval_requested", "approval_resolved", "completion_decided", "routing_decided", "plan_revised"];
const ENDS = new Set(["run_completed", "run_failed"]);

async function follow(run) {
  // An EventSource on a stream ticket: EventSource cannot send the token, so a short-lived
  // ticket for this run's stream goes in its URL instead (never the token). It resumes by
  // itself after a dropped connection (Last-Event-ID); after the run's terminal event the
  // server closes the stream and the source is closed here, before it would come back
  // (coming back, it would get a 204, which stops it too).
  if (current !== run || run.ended) return;
  let ticket;
  try { ticket = await api(`/runs/${run.id}/events/ticket`, { method: "POST" }); }
  catch (error) { $("#event-count").textContent = `stream: ${error.message}`; return; }
  if (current !== run) return;
  const after = run.lastSeq ? `&after=${run.lastSeq}` : "";
  const source = new EventSource(`/runs/${run.id}/events/stream?ticket=${encodeURIComponent(ticket.ticket)}${after}`);
  run.source = source;
  let last = null;
  const receive = (message) => {
    const event = JSON.parse(message.data);
    if (event.kind !== "token_delta") last = event.kind;
    onEvent(run, event);
  };
  for (const kind of KINDS) source.addEventListener(kind, receive);
  source.onerror = async () => {
    if (current !== run || run.source !== source) { source.close(); return; }
    const ended = ENDS.has(last);
    if (source.readyState !== EventSource.CLOSED && !ended) return; // it comes back by itself
    source.close(); // the run's end (or a refused ticket): do not come back
    run.source = null;
    let data;
    try { data = await api(`/runs/${run.id}`); } catch { return; }
    if (TERMINAL.has(data.status)) { run.ended = true; await refreshRun(run); return; }
    if (!ended) await new Promise((resolve) => setTimeout(resolve, 1000)); // a refused ticket
    follow(run); // a run resumed after failing goes on: follow it from where it was
  };
}

function onEvent(run, event) {
  if (current !== run) return;
  if (event.kind === "token_delta") {
    const key = `${event.step_id}`;
    let box = document.querySelector(`#tokens pre[data-step="${CSS.escape(key)}"]`);
    if (!box) {
      const title = Object.assign(document.createElement("h4"), { textContent: `step ${key}` });
      box = Object.assign(document.createElement("pre"), {});
      box.dataset.step = key;
      $("#tokens").append(title, box);
    }
    if (box.dataset.attempt !== String(event.attempt)) { box.textContent = ""; box.dataset.attempt = String(event.attempt); }
    box.textContent += event.text;
    return;
  }
  if (event.seq <= run.lastSeq) return;
  run.lastSeq = event.seq;
  const item = document.createElement("li");
  item.dataset.kind = event.kind;
  const seq = Object.assign(document.createElement("span"), { className: "seq", textContent: String(event.seq) });
  const detail = event.error || event.name || event.tool || "";
  item.append(seq, `${event.kind}${event.step_id ? " " + event.step_id : ""}${detail ? " " + detail : ""}`);
  $("#events").append(item);
  $("#event-count").textContent = `(${run.lastSeq})`;
  if (event.step_id && STEP_STATUS[event.kind]) {
    run.steps[event.step_id] = { ...(run.steps[event.step_id] || {}), status: STEP_STATUS[event.kind] };
    renderSteps(run);
  }
  if (REFRESH_ON.has(event.kind)) refreshRun(run);
}

if (token) start(); else askToken("");
