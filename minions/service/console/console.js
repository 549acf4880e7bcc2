// The minions console: the runs, filtered and paged; a run's timeline (each step and loop
// item a bar from its start to its end, retries and waits marked), its graph, its steps, its
// events as they come (Server-Sent Events, through an EventSource opened with a stream ticket:
// the token stays in headers), its output and streaming text; a step's calls in a drawer;
// cancel, resume, approve, reject; rerun a finished run from a step (its inputs, and a reused
// step's output, edited first), a rerun's lineage and its differences from its parent; the
// schedules, paused and resumed. No build step, no dependencies.
"use strict";

const TOKEN_KEY = "minions-token";
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const PAGE = Number(new URLSearchParams(location.search).get("page_size")) || 25; // runs a page
const $ = (selector) => document.querySelector(selector);

let token = sessionStorage.getItem(TOKEN_KEY);
let listTimer = null;
let current = null; // the run on screen (see showRun)
const list = { cursors: [null], total: 0, next: null, recipes: [] }; // cursors: one per page seen

// -- helpers ------------------------------------------------------------------------------

function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function swap(box, nodes) {
  // Replace what a pane shows only when it changed: a node under the pointer, the focus or a
  // test is not pulled away by a redraw that shows the same.
  const next = box.cloneNode(false);
  next.append(...nodes);
  if (next.innerHTML !== box.innerHTML) box.replaceChildren(...next.childNodes);
}

function statusBadge(status) {
  return el("span", { className: `status s-${status}`, textContent: status });
}

const tokensOf = (u) => (u && u.calls ? (u.prompt_tokens || 0) + (u.completion_tokens || 0) : null);
const number = (n) => (n === null || n === undefined ? "" : Number(n).toLocaleString("en"));

function absolute(t) {
  if (!t) return "";
  const d = new Date(t * 1000);
  const today = new Date().toDateString() === d.toDateString();
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return today ? time : `${d.toLocaleDateString([], { day: "numeric", month: "short", year: "numeric" })} ${time}`;
}

function relative(t) {
  if (!t) return "";
  const s = Date.now() / 1000 - t;
  if (s < -5) return `in ${ahead(-s)}`;
  if (s < 5) return "just now";
  if (s < 60) return `${Math.floor(s)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

function ahead(s) {
  if (s < 60) return `${Math.ceil(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

function interval(seconds) {
  // A schedule's interval as it was given: 30 s, 5 min, 2 h, 1 d.
  for (const [size, unit] of [[86400, "d"], [3600, "h"], [60, "min"]]) if (seconds >= size && seconds % size === 0) return `${seconds / size} ${unit}`;
  return `${seconds} s`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "";
  const s = Math.max(0, seconds);
  if (s < 10) return `${s.toFixed(2)} s`;
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(Math.round(s % 60)).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

function timeCell(t) {
  const cell = el("td", { className: "when" });
  if (!t) return cell;
  cell.append(el("time", { dateTime: new Date(t * 1000).toISOString(), title: new Date(t * 1000).toString(), textContent: relative(t) }),
    el("div", { className: "muted small", textContent: absolute(t) }));
  return cell;
}

// A message meant for the model ("Answer again, more briefly.") is never shown to a person:
// an error keeps its first line, without the sentences that tell the model what to do, cut
// short. The drawer shows more of it, never the note.
const TO_THE_MODEL = /^(answer|reply|respond|return|call|use|try|give|please|fix|output|write|only|make sure)\b/i;
function forPerson(text, max = 200) {
  if (!text) return "";
  const first = String(text).trim().split("\n")[0];
  const sentences = first.match(/[^.!?]+(?:[.!?]+(?=\s|$)|$)\s*/g) || [first];
  const kept = sentences.filter((s) => !TO_THE_MODEL.test(s.trim()));
  let out = (kept.length ? kept : sentences).join("").trim()
    .replace(/\byour (reply|answer|response|output)\b/gi, "the model's $1");
  if (out.length > max) out = `${out.slice(0, max - 1).trimEnd()}…`;
  return out;
}

function clipped(value, max = 4000) {
  const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
  return text && text.length > max ? `${text.slice(0, max)}\n… (${number(text.length - max)} more characters)` : text;
}

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
  clearInterval(listTimer);
  listTimer = setInterval(() => {
    if (!$("#list-view").hidden && list.cursors.length === 1) refreshList();
    if (!$("#schedules-view").hidden) refreshSchedules();
  }, 2000);
  route();
}

// -- the runs list ------------------------------------------------------------------------

async function loadRecipes() {
  const recipes = await api("/recipes");
  list.recipes = recipes.map((r) => r.id);
  $("#recipe").replaceChildren(...recipes.map((r) => el("option", { value: r.id, textContent: r.description ? `${r.id} — ${r.description}` : r.id })));
  $("#f-recipe").replaceChildren(el("option", { value: "", textContent: "any" }), ...recipes.map((r) => el("option", { value: r.id, textContent: r.id })));
}

function filters() {
  const params = new URLSearchParams();
  const id = $("#f-id").value.trim().toLowerCase();
  if (id) params.set("id_prefix", id);
  if ($("#f-status").value) params.set("status", $("#f-status").value);
  if ($("#f-recipe").value) params.set("recipe", $("#f-recipe").value);
  const since = $("#f-since").value;
  $("#custom-range").hidden = since !== "custom";
  if (since === "custom") {
    const from = $("#f-from").value, to = $("#f-to").value;
    if (from) params.set("created_after", String(new Date(from).getTime() / 1000));
    if (to) params.set("created_before", String(new Date(to).getTime() / 1000));
  } else if (since) {
    params.set("created_after", String(Math.floor(Date.now() / 1000 - Number(since))));
  }
  return params;
}

let refreshing = 0;
async function refreshList() {
  const params = filters();
  params.set("limit", String(PAGE));
  const cursor = list.cursors[list.cursors.length - 1];
  if (cursor) params.set("cursor", cursor);
  const mine = ++refreshing;
  let page;
  try { page = await api(`/runs?${params}`); } catch (error) {
    $("#connection").textContent = error.status ? error.message : "disconnected";
    return;
  }
  if (mine !== refreshing) return; // a newer refresh (other filters) was asked for meanwhile
  $("#connection").textContent = "";
  list.next = page.next_cursor;
  list.total = page.total;
  const history = page.history;
  $("#history").hidden = !(history && history.pruned_before);
  if (history && history.pruned_before) {
    $("#history").textContent = `History goes back to ${history.oldest_at ? absolute(history.oldest_at) : "now"}: runs that finished before ${absolute(history.pruned_before)} were pruned.`;
  }
  const rows = page.runs.map((r) => {
    const row = el("tr");
    row.dataset.run = r.run_id;
    row.dataset.status = r.status;
    const link = el("a", { href: `#/runs/${r.run_id}`, className: "mono", textContent: r.run_id.slice(0, 12), title: r.run_id });
    const ended = r.finished_at || (TERMINAL.has(r.status) ? null : Date.now() / 1000);
    row.append(
      el("td", {}, link),
      el("td", {}, statusBadge(r.status)),
      el("td", { className: "wide", textContent: r.recipe }),
      timeCell(r.created_at),
      el("td", { className: "num", textContent: r.started_at && ended ? duration(ended - r.started_at) : "" }),
      el("td", { className: "num wide", textContent: number(tokensOf(r.usage)) }),
      el("td", { className: "wide clip error", textContent: r.status === "failed" ? forPerson(r.error, 90) : "", title: r.status === "failed" ? forPerson(r.error, 400) : "" }),
    );
    row.addEventListener("click", (event) => { if (event.target.tagName !== "A") location.hash = `#/runs/${r.run_id}`; });
    return row;
  });
  if (!rows.length) rows.push(el("tr", { className: "empty" }, el("td", { colSpan: 7, textContent: "No runs match." })));
  swap($("#runs tbody"), rows);
  const first = (list.cursors.length - 1) * PAGE;
  $("#page-info").textContent = page.runs.length ? `${first + 1}–${first + page.runs.length} of ${number(page.total)}` : `0 of ${number(page.total)}`;
  $("#newer").disabled = list.cursors.length === 1;
  $("#older").disabled = !page.next_cursor;
}

function filtersChanged() { list.cursors = [null]; refreshList(); }
let typing = null;
$("#f-id").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(filtersChanged, 250); });
for (const id of ["#f-status", "#f-recipe", "#f-since", "#f-from", "#f-to"]) $(id).addEventListener("change", filtersChanged);
$("#filters").addEventListener("submit", async (event) => {
  // Enter in the search box: straight to the run when one run has that id prefix.
  event.preventDefault();
  clearTimeout(typing);
  list.cursors = [null];
  await refreshList();
  const rows = document.querySelectorAll("#runs tbody tr[data-run]");
  if (rows.length === 1 && $("#f-id").value.trim()) location.hash = `#/runs/${rows[0].dataset.run}`;
});
$("#filters").addEventListener("reset", () => setTimeout(filtersChanged, 0));
$("#older").addEventListener("click", () => { if (list.next) { list.cursors.push(list.next); refreshList(); } });
$("#newer").addEventListener("click", () => { if (list.cursors.length > 1) { list.cursors.pop(); refreshList(); } });

$("#submit-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  $("#submit-error").textContent = "";
  let inputs;
  try { inputs = JSON.parse($("#inputs").value || "{}"); } catch { $("#submit-error").textContent = "inputs: not JSON"; return; }
  try {
    const made = await api("/runs", { method: "POST", body: JSON.stringify({ recipe: $("#recipe").value, inputs }) });
    location.hash = `#/runs/${made.run_id}`;
  } catch (error) { $("#submit-error").textContent = error.message; }
});

// -- routes -------------------------------------------------------------------------------

function route() {
  const match = location.hash.match(/^#\/runs\/([^/]+)$/);
  const schedules = location.hash.match(/^#\/schedules(?:\/([^/]+))?$/);
  closeDrawer(false);
  if ($("#rerun-dialog").open) $("#rerun-dialog").close();
  $("#schedules-view").hidden = !schedules;
  if (schedules) {
    stopRun();
    $("#run-view").hidden = true;
    $("#list-view").hidden = true;
    showSchedules(schedules[1] ? decodeURIComponent(schedules[1]) : null);
  } else if (match) {
    $("#list-view").hidden = true;
    showRun(decodeURIComponent(match[1]));
  } else {
    stopRun();
    $("#run-view").hidden = true;
    $("#list-view").hidden = false;
    refreshList();
  }
}
window.addEventListener("hashchange", () => { if (token) route(); });

// -- one run ------------------------------------------------------------------------------

function stopRun() {
  if (current) {
    if (current.source) current.source.close();
    clearInterval(current.ticker);
  }
  current = null;
}

async function showRun(runId) {
  stopRun();
  const run = {
    id: runId, source: null, data: null, steps: {}, rows: new Map(), visits: {}, lastSeq: 0,
    ended: false, graph: [], startedAt: null, endedAt: null, ticker: null,
  };
  current = run;
  $("#run-view").hidden = false;
  $("#run-id").textContent = runId;
  for (const id of ["#events", "#approvals", "#steps tbody", "#timeline"]) $(id).replaceChildren();
  $("#tokens").replaceChildren(el("p", { className: "muted small", textContent: "A model's answer appears here as it is written." }));
  $("#event-count").textContent = "";
  $("#run-error").hidden = true;
  $("#lineage").hidden = true;
  $("#diff").hidden = true;
  $("#run-output").textContent = "";
  window.scrollTo(0, 0);
  await refreshRun(run);
  run.ticker = setInterval(() => { if (current === run && !run.ended && run.data && !TERMINAL.has(run.data.status)) render(run); }, 1000);
  follow(run);
}

async function refreshRun(run) {
  let data;
  try { data = await api(`/runs/${encodeURIComponent(run.id)}`); } catch (error) { $("#run-recipe").textContent = error.message; return; }
  if (current !== run) return;
  run.data = data;
  run.graph = data.graph;
  run.startedAt = data.started_at || run.startedAt || data.created_at;
  if (data.finished_at && !run.endedAt) run.endedAt = data.finished_at;
  for (const step of data.steps) {
    run.steps[step.step_id] = { ...(run.steps[step.step_id] || {}), status: step.status, record: step };
    fromRecord(run, step, step.step_id);
    for (const item of step.loop_items) fromRecord(run, item, step.step_id);
  }
  $("#run-status").replaceWith(Object.assign(statusBadge(data.status), { id: "run-status" }));
  $("#run-recipe").textContent = data.recipe;
  const end = data.finished_at || (TERMINAL.has(data.status) ? null : Date.now() / 1000);
  $("#run-times").textContent = [`created ${relative(data.created_at)} (${absolute(data.created_at)})`, data.started_at && end ? `${data.finished_at ? "took" : "running for"} ${duration(end - data.started_at)}` : ""].filter(Boolean).join(" · ");
  const u = data.usage || {};
  $("#run-usage").textContent = u.calls ? `${u.calls} model calls, ${number(tokensOf(u))} tokens (${number(u.prompt_tokens || 0)} in, ${number(u.completion_tokens || 0)} out)` : "";
  $("#cancel").disabled = TERMINAL.has(data.status);
  $("#resume").disabled = !(data.status === "failed" || data.status === "cancelled");
  $("#run-output").textContent = data.output === null || data.output === undefined ? "—" : clipped(data.output, 20000);
  renderApprovals(run, data.approvals.filter((a) => a.decided_at === null));
  renderLineage(data);
  render(run);
}

// -- a rerun's lineage, and its differences from its parent ----------------------------------

function renderLineage(data) {
  const parts = [];
  if (data.parent_run_id) {
    parts.push("Rerun of run ", el("a", { href: `#/runs/${data.parent_run_id}`, className: "mono parent", textContent: data.parent_run_id.slice(0, 12), title: data.parent_run_id }),
      " from step ", el("code", { textContent: data.from_step || "?" }), " ",
      el("button", { type: "button", id: "compare", textContent: "compare with parent", onclick: () => compare(current) }));
  }
  if (data.schedule) {
    if (parts.length) parts.push(" · ");
    parts.push("Fired by schedule ", el("a", { href: `#/schedules/${encodeURIComponent(data.schedule)}`, textContent: data.schedule }), data.slot ? ` for ${absolute(data.slot)}` : "");
  }
  $("#lineage").hidden = !parts.length;
  swap($("#lineage"), parts);
}

async function compare(run) {
  if (!run || !run.data || !run.data.parent_run_id) return;
  const box = $("#diff");
  box.hidden = false;
  $("#diff-first").replaceChildren(el("span", { className: "muted", textContent: "comparing…" }));
  let diff;
  try { diff = await api(`/runs/${encodeURIComponent(run.data.parent_run_id)}/diff/${encodeURIComponent(run.id)}`); }
  catch (error) { $("#diff-first").replaceChildren(el("span", { className: "error", textContent: error.message })); return; }
  if (current !== run) return;
  const first = diff.first_divergence;
  $("#diff-first").replaceChildren(first
    ? el("strong", {}, "First divergence: step ", el("code", { textContent: first }))
    : el("strong", { textContent: "No divergence: both runs did the same." }));
  $("#diff-summary").textContent = `parent ${diff.status[0]}, ${number(diff.tokens[0])} tokens, ${diff.calls[0]} calls · this run ${diff.status[1]}, ${number(diff.tokens[1])} tokens, ${diff.calls[1]} calls`;
  const pair = (a, b, show = (x) => x) => (a === b ? show(a) : `${show(a)} → ${show(b)}`);
  const rows = diff.steps.map((s) => {
    const name = s.visit > 1 ? `${s.step_id}#${s.visit}` : s.step_id;
    const row = el("tr", { className: `${s.diverges ? "diverges" : ""}${name === first || s.step_id === first ? " first" : ""}` });
    row.dataset.step = name;
    const [a, b] = s.status;
    const badge = (status) => (status ? statusBadge(status) : "—");
    const statuses = a === b ? el("td", {}, badge(a)) : el("td", {}, badge(a), " → ", badge(b));
    const changes = el("td", { className: "changes" });
    if (!s.changes.length) changes.append(el("span", { className: "muted", textContent: s.diverges ? "" : "same output" }));
    for (const c of s.changes.slice(0, 20)) {
      changes.append(el("div", {}, el("code", { textContent: !c.path || c.path === "$" ? "output" : c.path }), ": ", el("del", { textContent: clipped(c.a, 200) ?? "—" }), " → ", el("ins", { textContent: clipped(c.b, 200) ?? "—" })));
    }
    if (s.changes.length > 20) changes.append(el("div", { className: "muted", textContent: `… ${s.changes.length - 20} more` }));
    row.append(el("td", { className: "mono", textContent: name }), statuses, changes,
      el("td", { className: "num", textContent: pair(s.tokens[0], s.tokens[1], number) }),
      el("td", { className: "num", textContent: pair(s.calls[0], s.calls[1], String) }),
      el("td", { className: "num wide", textContent: pair(s.duration[0], s.duration[1], duration) }));
    return row;
  });
  $("#diff-table tbody").replaceChildren(...rows);
  box.scrollIntoView({ block: "nearest" });
}

// -- rerun from a step ------------------------------------------------------------------------

function downstream(graph, stepId) {
  // The steps that depend on `stepId`, directly or through others (its transitions too).
  const found = new Set();
  const todo = [stepId];
  while (todo.length) {
    const id = todo.pop();
    const node = graph.find((n) => n.id === id);
    const next = [...(node ? node.next : []), ...graph.filter((n) => n.depends_on.includes(id)).map((n) => n.id)];
    for (const n of next) if (!found.has(n)) { found.add(n); todo.push(n); }
  }
  return found;
}

function openRerun(run, stepId) {
  if (!run || !run.data) return;
  const dialog = $("#rerun-dialog");
  dialog.dataset.step = stepId;
  $("#rerun-step").textContent = stepId;
  $("#rerun-title").textContent = `rerun from step ${stepId}`;
  $("#rerun-inputs").value = JSON.stringify(run.data.inputs || {}, null, 2);
  $("#rerun-error").textContent = "";
  const later = downstream(run.graph, stepId);
  const reusable = run.graph.map((n) => n.id).filter((id) => id !== stepId && !later.has(id) && ["completed", "reused"].includes(stepStatus(run, id)));
  $("#rerun-set").replaceChildren(el("option", { value: "", textContent: "— none —" }), ...reusable.map((id) => el("option", { value: id, textContent: id })));
  $("#rerun-output-label").hidden = true;
  $("#rerun-output").value = "";
  dialog.showModal();
  $("#rerun-inputs").focus();
}

$("#rerun-set").addEventListener("change", () => {
  const id = $("#rerun-set").value;
  $("#rerun-output-label").hidden = !id;
  const record = id && current && current.steps[id] ? current.steps[id].record : null;
  $("#rerun-output").value = record ? JSON.stringify(record.output, null, 2) : "";
});
$("#rerun-cancel").addEventListener("click", () => $("#rerun-dialog").close());
$("#rerun-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const run = current;
  const stepId = $("#rerun-dialog").dataset.step;
  const say = (text) => { $("#rerun-error").textContent = text; };
  say("");
  const body = { from_step: stepId };
  try { body.inputs = JSON.parse($("#rerun-inputs").value || "{}"); } catch { say("The inputs are not valid JSON."); return; }
  if (typeof body.inputs !== "object" || body.inputs === null || Array.isArray(body.inputs)) { say("The inputs must be a JSON object, like {\"text\": \"hi\"}."); return; }
  const set = $("#rerun-set").value;
  if (set) {
    try { body.outputs = { [set]: JSON.parse($("#rerun-output").value) }; }
    catch { say(`The new output of step ${set} is not valid JSON (a text goes in quotes).`); return; }
  }
  $("#rerun-submit").disabled = true;
  try {
    const made = await api(`/runs/${encodeURIComponent(run.id)}/rerun`, { method: "POST", body: JSON.stringify(body) });
    $("#rerun-dialog").close();
    location.hash = `#/runs/${made.run_id}`;
  } catch (error) {
    if (error.type === "wrong_state") say(`This run cannot be rerun now: ${error.message}`);
    else if (error.type === "invalid_rerun") say(`This rerun is not possible: ${error.message}`);
    else say(error.message);
  } finally { $("#rerun-submit").disabled = false; }
});

function fromRecord(run, record, base) {
  // A stored execution fills in what the events did not tell (a run resumed from its
  // checkpoints starts no step again).
  const key = `${record.step_id}#${record.visit}`;
  const row = run.rows.get(key) || newRow(run, record.step_id, base, record.visit);
  row.status = record.status;
  row.start = row.start || record.started_at;
  row.end = row.end || record.finished_at;
  row.usage = record.usage;
  row.error = record.error;
  row.attempts = record.attempts;
}

function newRow(run, stepId, base, visit) {
  const row = { key: `${stepId}#${visit}`, id: stepId, base, visit, item: stepId !== base, status: "pending", start: null, end: null, usage: null, error: null, retries: [], waits: [], reason: null };
  run.rows.set(row.key, row);
  return row;
}

function renderApprovals(run, waiting) {
  const boxes = waiting.map((a) => {
    const box = el("div", { className: "approval" });
    box.dataset.call = a.call_id;
    const what = el("span", { textContent: `step ${a.step_id} wants to call ${a.tool}(${JSON.stringify(a.arguments)})` });
    const approve = el("button", { type: "button", className: "approve", textContent: "approve" });
    const reason = el("input", { placeholder: "reason (for a rejection)", className: "reason", ariaLabel: "reason for a rejection" });
    const reject = el("button", { type: "button", className: "reject", textContent: "reject" });
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

function render(run) {
  renderTimeline(run);
  renderGraph(run);
  renderSteps(run);
  renderError(run);
}

function stepStatus(run, id) {
  return (run.steps[id] && run.steps[id].status) || "pending";
}

function lastRow(run, id) {
  const visit = run.visits[id];
  return visit ? run.rows.get(`${id}#${visit}`) : [...run.rows.values()].filter((r) => r.id === id).pop();
}

// -- the run's error: on the failed step's row, once ----------------------------------------

function renderError(run) {
  const data = run.data;
  const banner = $("#run-error");
  if (!data || data.status !== "failed") { banner.hidden = true; return; }
  const failed = [...run.rows.values()].find((r) => r.status === "failed" && !r.item);
  if (failed) {
    banner.replaceChildren(`Failed at step ${failed.id}.`, el("button", { type: "button", textContent: "see the step", onclick: () => openDrawer(run, failed.base) }));
  } else {
    banner.replaceChildren(forPerson(data.error, 300) || "Failed.");
  }
  banner.hidden = false;
}

// -- the timeline ---------------------------------------------------------------------------

function renderTimeline(run) {
  const rows = [...run.rows.values()];
  const starts = rows.map((r) => r.start).filter(Boolean);
  const t0 = Math.min(...[run.startedAt, ...starts].filter(Boolean));
  const live = run.data && !TERMINAL.has(run.data.status);
  const ends = rows.map((r) => r.end).filter(Boolean);
  const t1 = Math.max(live ? Date.now() / 1000 : 0, run.endedAt || 0, ...ends, ...starts, t0 + 0.001);
  const box = $("#timeline");
  if (!Number.isFinite(t0) || !rows.length) {
    swap(box, [el("p", { className: "muted small", textContent: "No step has started yet." })]);
    $("#timeline-span").textContent = "";
    return;
  }
  const span = t1 - t0;
  const at = (t) => `${Math.min(100, Math.max(0, ((t - t0) / span) * 100)).toFixed(3)}%`;
  $("#timeline-span").textContent = `${duration(span)} from ${absolute(t0)}`;
  const axis = el("div", { className: "tl-axis" }, el("span", { textContent: "step" }));
  const ticks = el("div", { className: "tl-ticks" });
  for (let i = 0; i <= 4; i += 1) ticks.append(el("span", { textContent: i === 0 ? "0" : `+${duration((span * i) / 4)}`, style: `left:${i * 25}%` }));
  axis.append(ticks);
  // Steps in the order they started (loop items under their step), then the rest.
  const order = (r) => (r.start === null ? Infinity : r.start);
  const parents = rows.filter((r) => !r.item).sort((a, b) => order(a) - order(b));
  const ordered = [];
  for (const parent of parents) {
    ordered.push(parent);
    ordered.push(...rows.filter((r) => r.item && r.base === parent.base && r.visit === parent.visit).sort((a, b) => order(a) - order(b)));
  }
  ordered.push(...rows.filter((r) => r.item && !ordered.includes(r)));
  const lines = ordered.map((r) => {
    const line = el("div", { className: `tl-row${r.item ? " item" : ""}` });
    line.dataset.step = r.id;
    line.dataset.status = r.status;
    const visits = rows.filter((o) => o.id === r.id).length;
    const label = el("button", { type: "button", className: "tl-label", textContent: visits > 1 ? `${r.id} (${r.visit})` : r.id, title: `${r.id}: ${r.status} — open the step` });
    label.addEventListener("click", () => openDrawer(current, r.base));
    const track = el("div", { className: "tl-track" });
    if (r.start) {
      const end = r.end || (live ? Date.now() / 1000 : t1);
      const tokens = tokensOf(r.usage);
      const bar = el("div", { className: `tl-bar s-${r.status}`, title: r.status === "reused" ? `${r.id}: reused from the parent run, no call` : `${r.id}: ${r.status}, ${duration(end - r.start)}${tokens ? `, ${number(tokens)} tokens` : ""}` });
      bar.style.left = at(r.start);
      bar.style.width = `calc(${at(end)} - ${at(r.start)})`;
      track.append(bar);
    } else if (r.status === "skipped") {
      track.append(el("span", { className: "tl-skip", textContent: `skipped${r.reason ? `: ${forPerson(r.reason, 80)}` : ""}` }));
    }
    for (const w of r.waits) {
      const how = w.model ? `${w.text}; waited` : "waited for a person";
      const wait = el("div", { className: `tl-wait${w.model ? " model" : ""}`, title: `${how} ${duration((w.to || Date.now() / 1000) - w.from)}` });
      wait.style.left = at(w.from);
      wait.style.width = `calc(${at(w.to || (live ? Date.now() / 1000 : t1))} - ${at(w.from)})`;
      track.append(wait);
    }
    for (const retry of r.retries) {
      const mark = el("span", { className: "tl-retry", title: `retry (${retry.target}, attempt ${retry.attempt} failed): ${forPerson(retry.reason, 160)}` });
      mark.style.left = at(retry.at);
      track.append(mark);
    }
    line.append(label, track);
    return line;
  });
  swap(box, [axis, ...lines]);
}

// -- the graph ------------------------------------------------------------------------------

function renderGraph(run) {
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
  const W = 140, H = 34, GX = 46, GY = 14;
  const place = {};
  Object.entries(columns).forEach(([col, ids]) => ids.forEach((id, row) => { place[id] = { x: 10 + col * (W + GX), y: 10 + row * (H + GY) }; }));
  const ns = "http://www.w3.org/2000/svg";
  const svg = $("#graph");
  const make = (tag, attrs) => { const n = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v); return n; };
  const defs = make("defs", {});
  const marker = make("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" });
  marker.append(make("path", { d: "M 0 0 L 10 5 L 0 10 z" }));
  defs.append(marker);
  const parts = [defs];
  const edge = (a, b) => {
    const back = b.x <= a.x; // a transition back to an earlier step: around, below
    const d = back
      ? `M ${a.x + W / 2} ${a.y + H} C ${a.x + W / 2} ${a.y + H + 30}, ${b.x + W / 2} ${b.y + H + 30}, ${b.x + W / 2} ${b.y + H + 1}`
      : `M ${a.x + W} ${a.y + H / 2} C ${a.x + W + GX / 2} ${a.y + H / 2}, ${b.x - GX / 2} ${b.y + H / 2}, ${b.x - 1} ${b.y + H / 2}`;
    return make("path", { d, "marker-end": "url(#arrow)" });
  };
  for (const n of nodes) {
    for (const target of n.next) if (place[target]) parts.push(edge(place[n.id], place[target]));
    for (const source of n.depends_on) if (place[source] && !nodes.find((m) => m.id === source).next.includes(n.id)) parts.push(edge(place[source], place[n.id]));
  }
  for (const n of nodes) {
    const status = stepStatus(run, n.id);
    const g = make("g", { class: `node n-${status}`, tabindex: "0", role: "button", "aria-label": `${n.kind} step ${n.id}: ${status}; open it` });
    g.dataset.step = n.id;
    g.dataset.status = status;
    const label = n.id.length > 16 ? `${n.id.slice(0, 15)}…` : n.id;
    g.append(make("rect", { x: place[n.id].x, y: place[n.id].y, width: W, height: H }));
    const text = make("text", { x: place[n.id].x + 8, y: place[n.id].y + H / 2 + 4 });
    text.textContent = `${label} · ${status}`;
    const title = make("title", {});
    title.textContent = `${n.kind} step ${n.id}: ${status}`;
    g.append(text, title);
    g.addEventListener("click", () => openDrawer(current, n.id));
    g.addEventListener("keydown", (event) => { if (event.key === "Enter" || event.key === " ") { event.preventDefault(); openDrawer(current, n.id); } });
    parts.push(g);
  }
  const cols = Object.keys(columns).length, rows = Math.max(1, ...Object.values(columns).map((c) => c.length));
  const width = Math.max(1, cols) * (W + GX) + 20, height = rows * (H + GY) + 40;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  swap(svg, parts);
}

// -- the steps table --------------------------------------------------------------------------

function renderSteps(run) {
  const ids = run.graph.map((n) => n.id);
  for (const r of run.rows.values()) if (!r.item && !ids.includes(r.id)) ids.push(r.id);
  const rows = ids.map((id) => {
    const status = stepStatus(run, id);
    const last = lastRow(run, id) || {};
    const record = (run.steps[id] && run.steps[id].record) || {};
    const row = el("tr");
    row.dataset.step = id;
    row.dataset.status = status;
    const open = el("button", { type: "button", textContent: id, title: "open the step" });
    open.addEventListener("click", () => openDrawer(current, id));
    const usage = last.usage || record.usage;
    const end = last.end || (last.start && !TERMINAL.has(status) && status !== "skipped" ? Date.now() / 1000 : null);
    let result;
    if (status === "failed") result = el("td", { className: "result error", textContent: forPerson(last.error || record.error) });
    else if (status === "skipped") result = el("td", { className: "result muted", textContent: forPerson(last.reason, 120) });
    else {
      const output = record.output === undefined || record.output === null ? "" : (typeof record.output === "string" ? record.output : JSON.stringify(record.output));
      result = el("td", { className: "result", textContent: output.slice(0, 300), title: output.slice(0, 1000) });
    }
    row.append(
      el("td", {}, open),
      el("td", {}, statusBadge(status)),
      el("td", { className: "wide when", textContent: absolute(last.start) }),
      el("td", { className: "num", textContent: last.start && end ? duration(end - last.start) : "" }),
      el("td", { className: "num", textContent: number(tokensOf(usage)) }),
      result,
      el("td", {}, rerunnable(run, id) ? el("button", { type: "button", className: "rerun", textContent: "rerun from here", title: `a new run from step ${id}`, onclick: () => openRerun(current, id) }) : ""),
    );
    return row;
  });
  swap($("#steps tbody"), rows);
}

function rerunnable(run, stepId) {
  // An ended run's step of the recipe (not a loop item) that ran or was reused.
  return Boolean(run.data && TERMINAL.has(run.data.status) && run.graph.some((n) => n.id === stepId) && !["pending", "skipped"].includes(stepStatus(run, stepId)));
}

// -- the step drawer --------------------------------------------------------------------------

let opener = null;
async function openDrawer(run, stepId) {
  // The panes' handlers pass `current`, never the run they were drawn for: a pane that
  // `swap` kept (it showed the same) may have been drawn for another run.
  if (!run) return;
  opener = document.activeElement;
  const drawer = $("#drawer");
  drawer.hidden = false;
  drawer.dataset.step = stepId;
  $("#drawer-title").replaceChildren(`step ${stepId} `, statusBadge(stepStatus(run, stepId)));
  $("#drawer-body").replaceChildren(el("p", { className: "muted", textContent: "loading…" }));
  $("#drawer-close").focus();
  let detail;
  try { detail = await api(`/runs/${encodeURIComponent(run.id)}/steps/${encodeURIComponent(stepId)}`); }
  catch (error) { $("#drawer-body").replaceChildren(el("p", { className: "error", textContent: error.message })); return; }
  if (current !== run || drawer.dataset.step !== stepId) return;
  $("#drawer-title").replaceChildren(`step ${stepId} `, statusBadge(detail.status));
  const extra = [];
  if (rerunnable(run, stepId)) extra.push(el("p", {}, el("button", { type: "button", className: "rerun", textContent: "rerun from here", onclick: () => openRerun(current, stepId) })));
  const record = run.steps[stepId] && run.steps[stepId].record;
  if (record && record.reused_from) {
    const cost = tokensOf(record.reused_usage);
    extra.push(el("p", { className: "reused-note" }, "Reused as recorded in run ", el("a", { href: `#/runs/${record.reused_from}`, className: "mono", textContent: record.reused_from.slice(0, 12), title: record.reused_from }),
      `: no model or tool call this time${cost ? ` (it cost ${number(cost)} tokens there)` : ""}.`));
  }
  $("#drawer-body").replaceChildren(...extra, ...stepDetail(detail), ...modelWaits(run, stepId));
}

function closeDrawer(refocus = true) {
  const drawer = $("#drawer");
  if (drawer.hidden) return;
  drawer.hidden = true;
  drawer.dataset.step = "";
  if (refocus && opener && document.contains(opener)) opener.focus();
}
$("#drawer-close").addEventListener("click", () => closeDrawer());
// Escape in the rerun editor closes the editor only (the browser does), not the drawer under it.
document.addEventListener("keydown", (event) => { if (event.key === "Escape" && !$("#rerun-dialog").open) closeDrawer(); });

function facts(pairs) {
  const dl = el("dl");
  for (const [name, value] of pairs) if (value !== "" && value !== null && value !== undefined) dl.append(el("dt", { textContent: name }), el("dd", {}, value));
  return dl;
}

function itemName(call) {
  return call.item === null || call.item === undefined ? "" : `item ${call.item} · `;
}

const CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

function callContent(call) {
  // A model call's request and answer, when the server kept them (content capture): each in
  // a collapsible, bounded, scrollable pre; the messages labelled by role.
  if (!call.messages || !call.messages.length) return [];
  const lines = call.messages.map((m) => `── ${m.role} ──\n${m.text}`);
  if (call.messages_omitted) lines.splice(1, 0, `── … ${call.messages_omitted} message${call.messages_omitted === 1 ? "" : "s"} not kept (the request was too long) ──`);
  const count = call.messages.length + (call.messages_omitted || 0);
  const parts = [el("details", { className: "request" },
    el("summary", { textContent: `request (${count} message${count === 1 ? "" : "s"})` }),
    el("pre", { className: "request-text", textContent: lines.join("\n\n") }))];
  if (call.answer !== null && call.answer !== undefined) {
    parts.push(el("details", { className: "answer", open: true },
      el("summary", { textContent: "answer" }),
      el("pre", { className: "answer-text", textContent: call.answer || "(no text: it asked for tool calls)" })));
  }
  return parts;
}

function stepDetail(d) {
  const parts = [];
  const execution = d.executions[d.executions.length - 1] || {};
  const usage = d.usage || {};
  const took = d.started_at && d.finished_at ? duration(d.finished_at - d.started_at) : "";
  parts.push(facts([
    ["kind", d.kind],
    ["started", d.started_at ? `${absolute(d.started_at)} (${relative(d.started_at)})` : ""],
    ["ended", d.finished_at ? absolute(d.finished_at) : ""],
    ["took", took],
    ["visits", d.executions.length > 1 ? String(d.executions.length) : ""],
    ["tokens", usage.calls ? `${number(tokensOf(usage))} (${number(usage.prompt_tokens || 0)} in, ${number(usage.completion_tokens || 0)} out)` : ""],
    ["model calls", d.model_calls.length ? String(d.model_calls.length) : ""],
    ["tool calls", d.tool_calls.length ? String(d.tool_calls.length) : ""],
    ["retries", d.retries.length ? String(d.retries.length) : ""],
  ]));
  if (d.error) parts.push(el("h3", { textContent: "error" }), el("p", { className: "error step-error", textContent: forPerson(d.error, 1000) }));
  if (d.skipped) parts.push(el("h3", { textContent: "skipped" }), el("p", { textContent: forPerson(d.skipped, 1000) }));
  if (execution.output !== undefined && execution.output !== null) parts.push(el("h3", { textContent: "output" }), el("pre", { className: "step-output", textContent: clipped(execution.output) }));
  if (execution.loop_items && execution.loop_items.length) {
    const table = el("table", {}, el("thead", {}, el("tr", {}, ...["item", "status", "took", "result"].map((t) => el("th", { textContent: t })))));
    const body = el("tbody");
    for (const item of execution.loop_items) {
      body.append(el("tr", {},
        el("td", { className: "mono", textContent: item.step_id }), el("td", {}, statusBadge(item.status)),
        el("td", { className: "num", textContent: item.started_at && item.finished_at ? duration(item.finished_at - item.started_at) : "" }),
        el("td", { className: item.error ? "error" : "", textContent: item.error ? forPerson(item.error) : clipped(item.output, 200) })));
    }
    table.append(body);
    parts.push(el("h3", { textContent: `loop items (${execution.loop_items.length})` }), el("div", { className: "table-wrap" }, table));
  }
  parts.push(el("h3", { textContent: "requests to the model" }));
  if (!d.model_calls.length) parts.push(el("p", { className: "muted", textContent: "None: this step did not call a model." }));
  for (const call of d.model_calls) {
    const tokens = tokensOf(call.usage);
    const box = el("div", { className: "call model-call" },
      el("div", { className: "title" }, el("strong", { textContent: `${itemName(call)}turn ${call.turn}, attempt ${call.attempt}` }),
        el("span", { className: "muted", textContent: [call.model, call.finished_at ? duration(call.finished_at - call.started_at) : "", tokens ? `${number(tokens)} tokens` : "", call.finish_reason ? `finish: ${call.finish_reason}` : "", call.output_mode ? `mode: ${call.output_mode}` : ""].filter(Boolean).join(" · ") })));
    if (call.tool_calls.length) box.append(el("div", { textContent: `answered with calls to ${call.tool_calls.join(", ")}` }));
    else if (!call.error && call.finished_at) box.append(el("div", { className: "muted", textContent: "answered with text" }));
    if (call.error) box.append(el("div", { className: "error", textContent: forPerson(call.error, 400) }));
    box.append(...callContent(call));
    parts.push(box);
  }
  // Said once, under the calls: content capture is the server's switch, not one call's.
  if (d.model_calls.some((c) => !(c.messages && c.messages.length))) parts.push(el("p", { className: "note prompts-not-kept", textContent: `Prompts are not kept: start the worker (or serve) with ${CAPTURE_ENV}=true to keep them (they may hold users' data); tool arguments and results are kept, and the step's output is above.` }));
  parts.push(el("h3", { textContent: "tool calls" }));
  if (!d.tool_calls.length) parts.push(el("p", { className: "muted", textContent: "None." }));
  for (const call of d.tool_calls) {
    const box = el("div", { className: "call tool-call" },
      el("div", { className: "title" }, el("strong", { className: "mono", textContent: `${itemName(call)}${call.name}` }),
        el("span", { className: "muted", textContent: [call.finished_at ? duration(call.finished_at - call.started_at) : "running", call.attempts > 1 ? `${call.attempts} attempts` : ""].filter(Boolean).join(" · ") })),
      el("div", { className: "muted small", textContent: "arguments" }), el("pre", { className: "arguments", textContent: clipped(call.arguments) }));
    if (call.result !== null) box.append(el("div", { className: "muted small", textContent: "result" }), el("pre", { className: "result", textContent: clipped(call.result) }));
    if (call.error) box.append(el("div", { className: "error", textContent: forPerson(call.error, 400) }));
    parts.push(box);
  }
  if (d.retries.length) {
    parts.push(el("h3", { textContent: "retries" }));
    const what = { model: "the model call failed", output: "the answer was unusable; asked again", tool: "the tool failed" };
    for (const r of d.retries) {
      parts.push(el("div", { className: "call retry" },
        el("div", { className: "title" }, el("strong", { textContent: `${itemName(r)}${what[r.target] || r.target} (attempt ${r.attempt})` }),
          el("span", { className: "muted", textContent: `${absolute(r.at)}${r.delay ? ` · waited ${duration(r.delay)}` : ""}` })),
        el("div", { className: "reason", textContent: forPerson(r.reason, 400) })));
    }
  }
  if (d.approvals.length) {
    parts.push(el("h3", { textContent: "approvals" }));
    for (const a of d.approvals) {
      const verdict = a.decided_at === null ? "waiting" : a.approved ? "approved" : "rejected";
      parts.push(el("div", { className: "call approval-record" },
        el("div", { className: "title" }, el("strong", { className: "mono", textContent: a.tool }), el("span", { className: "muted", textContent: `${verdict}${a.decided_at ? ` after ${duration(a.decided_at - a.requested_at)}` : ""}${a.reason ? `: ${a.reason}` : ""}` })),
        el("pre", { textContent: clipped(a.arguments) })));
    }
  }
  if (d.decisions.length) {
    parts.push(el("h3", { textContent: "completion decisions" }));
    const ul = el("ul");
    for (const c of d.decisions) ul.append(el("li", { textContent: `${itemName(c)}${c.link}: ${c.decision}${c.reason && c.reason !== c.decision ? ` — ${forPerson(c.reason, 160)}` : ""}` }));
    parts.push(ul);
  }
  return parts;
}

const WAIT_REASON = {
  max_concurrent: "as many calls as allowed were in flight",
  requests_per_minute: "its requests per minute were used up",
  tokens_per_minute: "its tokens per minute were used up",
  retry_after: "it asked to wait (429, Retry-After)",
};

function waitText(event) {
  return `waits for ${event.endpoint || event.model || "its model endpoint"}: ${WAIT_REASON[event.reason] || event.reason}${event.delay ? `, about ${duration(event.delay)}` : ""}`;
}

function modelWaits(run, stepId) {
  // The waits for a model endpoint's limits, from the events this page saw.
  const waits = [...run.rows.values()].filter((r) => r.base === stepId).flatMap((r) => r.waits.filter((w) => w.model).map((w) => ({ ...w, id: r.id })));
  if (!waits.length) return [];
  const ul = el("ul", { className: "model-waits" });
  for (const w of waits) ul.append(el("li", { textContent: `${w.id !== stepId ? `${w.id}: ` : ""}${w.text}${w.to ? ` — waited ${duration(w.to - w.from)}` : " — waiting"}` }));
  return [el("h3", { textContent: `waits for the model endpoint (${waits.length})` }), ul];
}

// -- the event stream ---------------------------------------------------------------------

const STEP_STATUS = { step_reused: "reused", step_started: "running", approval_requested: "waiting", approval_resolved: "running", step_completed: "completed", step_failed: "failed", step_skipped: "skipped" };
const REFRESH_ON = new Set(["step_reused", "rerun_planned", "step_completed", "step_failed", "step_skipped", "approval_requested", "approval_resolved", "run_completed", "run_failed", "run_started"]);
const KINDS = ["run_started", "run_completed", "run_failed", "step_started", "step_completed", "step_failed", "step_skipped", "model_call_waiting", "model_call_started", "model_call_completed", "model_call_failed", "token_delta", "tool_call_started", "tool_call_completed", "tool_call_failed", "retry_scheduled", "output_mode_demoted", "approval_requested", "approval_resolved", "completion_decided", "routing_decided", "plan_revised", "rerun_planned", "step_reused", "step_cached"];
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

function baseOf(stepId) {
  return stepId.replace(/\[[0-9]+\]$/, "");
}

function track(run, event) {
  // The timeline's rows, from the events: a step (visit) or loop item starts, waits, retries
  // and ends.
  const id = event.step_id;
  const t = event.timestamp;
  if (event.kind === "run_started" && !run.startedAt) run.startedAt = t;
  if (ENDS.has(event.kind) && !run.endedAt) run.endedAt = t;
  if (!id) return;
  if (event.kind === "step_started") {
    run.visits[id] = event.visit;
    const row = run.rows.get(`${id}#${event.visit}`) || newRow(run, id, baseOf(id), event.visit);
    // A step started again (its run resumed after failing) is drawn from its new start.
    Object.assign(row, { status: "running", start: t, end: null, error: null, reason: null });
    return;
  }
  let row = lastRow(run, id);
  if (!row && (event.kind === "step_skipped" || event.kind === "step_reused")) row = newRow(run, id, baseOf(id), event.visit || 1);
  if (!row) return;
  switch (event.kind) {
    case "step_completed": Object.assign(row, { status: "completed", end: t, usage: event.usage }); break;
    case "step_failed": Object.assign(row, { status: "failed", end: t, usage: event.usage, error: event.error }); break;
    case "step_skipped": Object.assign(row, { status: "skipped", reason: event.reason }); break;
    case "approval_requested": row.status = "waiting"; row.waits.push({ from: t, to: null }); break;
    case "approval_resolved": row.status = "running"; { const w = row.waits.find((x) => x.to === null && !x.model); if (w) w.to = t; } break;
    case "step_reused": Object.assign(row, { status: "reused", start: row.start || t, end: row.end || t }); break;
    case "model_call_waiting": row.waits.push({ from: t, to: null, model: true, text: waitText(event) }); break;
    case "model_call_started": case "model_call_failed": { const w = row.waits.find((x) => x.to === null && x.model); if (w) w.to = t; } break;
    case "retry_scheduled": row.retries.push({ at: t, target: event.target, attempt: event.attempt, reason: event.reason }); break;
    default: break;
  }
}

function onEvent(run, event) {
  if (current !== run) return;
  if (event.kind === "token_delta") {
    const key = `${event.step_id}`;
    let box = document.querySelector(`#tokens pre[data-step="${CSS.escape(key)}"]`);
    if (!box) {
      const hint = $("#tokens p");
      if (hint) hint.remove();
      box = el("pre");
      box.dataset.step = key;
      $("#tokens").append(el("h4", { textContent: `step ${key}` }), box);
    }
    if (box.dataset.attempt !== String(event.attempt)) { box.textContent = ""; box.dataset.attempt = String(event.attempt); }
    box.textContent += event.text;
    box.scrollTop = box.scrollHeight;
    return;
  }
  if (event.seq <= run.lastSeq) return;
  run.lastSeq = event.seq;
  track(run, event);
  const item = el("li");
  item.dataset.kind = event.kind;
  const detail = event.kind === "model_call_waiting" ? waitText(event)
    : event.kind === "step_reused" ? `from run ${String(event.source_run_id).slice(0, 12)}${event.edited ? " (its output set by hand)" : ""}`
    : event.kind === "rerun_planned" ? `of run ${String(event.parent_run_id).slice(0, 12)} from step ${event.from_step}`
    : event.kind === "step_cached" ? `from the cache (made ${duration(event.age)} ago${tokensOf(event.saved) ? `, saved ${number(tokensOf(event.saved))} tokens` : ""})`
    : event.error || event.reason || event.name || event.tool || "";
  const since = run.startedAt ? `+${duration(event.timestamp - run.startedAt)}` : "";
  item.append(el("span", { className: "seq", textContent: String(event.seq) }), el("span", { className: "at", textContent: since, title: absolute(event.timestamp) }),
    `${event.kind}${event.step_id ? ` ${event.step_id}` : ""}${detail ? ` ${forPerson(detail, 160)}` : ""}`);
  const box = $("#events");
  const atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  box.append(item);
  if (atEnd) box.scrollTop = box.scrollHeight;
  $("#event-count").textContent = `(${run.lastSeq})`;
  if (event.step_id && STEP_STATUS[event.kind] && !/\[[0-9]+\]$/.test(event.step_id)) {
    run.steps[event.step_id] = { ...(run.steps[event.step_id] || {}), status: STEP_STATUS[event.kind] };
  }
  if (REFRESH_ON.has(event.kind)) scheduleRefresh(run); else scheduleRender(run);
}

function scheduleRefresh(run) {
  // A finished run's events come all at once: read the run once for them.
  if (run.refreshing) return;
  run.refreshing = setTimeout(async () => { run.refreshing = null; await refreshRun(run); }, 100);
}

let pending = null;
function scheduleRender(run) {
  // Many events come at once (a finished run's, replayed): draw once per frame.
  if (pending) return;
  pending = requestAnimationFrame(() => { pending = null; if (current === run) render(run); });
}

// -- the schedules ----------------------------------------------------------------------------

let scheduleShown = null; // the schedule whose runs are shown

function showSchedules(name) {
  scheduleShown = name;
  $("#schedule-runs").hidden = !name;
  if (name) $("#schedule-runs tbody").replaceChildren();
  refreshSchedules();
}

async function refreshSchedules() {
  let schedules;
  try { schedules = await api("/schedules"); } catch (error) { $("#schedules-error").textContent = error.message; return; }
  $("#schedules-error").textContent = "";
  const rows = schedules.map((s) => {
    const row = el("tr", { className: s.name === scheduleShown ? "chosen" : "" });
    row.dataset.schedule = s.name;
    row.dataset.paused = String(s.paused);
    const when = s.cron ? `cron ${s.cron}${s.timezone && s.timezone !== "UTC" ? ` (${s.timezone})` : " (UTC)"}` : `every ${interval(s.every)}`;
    const last = s.last_fired_at ? timeCell(s.last_fired_at) : el("td", { className: "muted", textContent: "never" });
    if (s.last_run_id) last.append(el("div", {}, el("a", { href: `#/runs/${s.last_run_id}`, className: "mono last-run", textContent: s.last_run_id.slice(0, 12), title: s.last_run_id })));
    const toggle = el("button", { type: "button", className: s.paused ? "resume" : "pause", textContent: s.paused ? "resume" : "pause" });
    toggle.addEventListener("click", async () => {
      try { await api(`/schedules/${encodeURIComponent(s.name)}/${s.paused ? "resume" : "pause"}`, { method: "POST" }); }
      catch (error) { $("#schedules-error").textContent = error.message; }
      await refreshSchedules();
    });
    row.append(
      el("td", {}, el("a", { href: `#/schedules/${encodeURIComponent(s.name)}`, textContent: s.name, title: "its runs" })),
      el("td", { className: "wide", textContent: s.recipe }),
      el("td", { className: "mono small", textContent: when }),
      el("td", {}, el("span", { className: `status ${s.paused ? "s-paused" : "s-active"}`, textContent: s.paused ? "paused" : "active" })),
      s.paused ? el("td", { className: "muted", textContent: "—" }) : timeCell(s.next_at),
      last,
      el("td", { className: "num", textContent: number(s.fired) }),
      el("td", {}, toggle),
    );
    return row;
  });
  if (!rows.length) rows.push(el("tr", { className: "empty" }, el("td", { colSpan: 8, textContent: "No schedules. Add one with `minions schedules add RECIPE --every 1h` or POST /schedules." })));
  swap($("#schedules tbody"), rows);
  if (scheduleShown) await refreshScheduleRuns(scheduleShown);
}

async function refreshScheduleRuns(name) {
  let detail;
  try { detail = await api(`/schedules/${encodeURIComponent(name)}`); }
  catch (error) { $("#schedule-runs-title").textContent = error.message; return; }
  if (scheduleShown !== name) return;
  $("#schedule-runs-title").textContent = `runs of ${name} (${detail.runs.length}${detail.fired > detail.runs.length ? ` of ${number(detail.fired)}` : ""})`;
  const rows = detail.runs.map((r) => {
    const row = el("tr");
    row.dataset.run = r.run_id;
    const ended = r.finished_at || (TERMINAL.has(r.status) ? null : Date.now() / 1000);
    row.append(el("td", {}, el("a", { href: `#/runs/${r.run_id}`, className: "mono", textContent: r.run_id.slice(0, 12), title: r.run_id })),
      el("td", {}, statusBadge(r.status)), el("td", { textContent: r.slot ? absolute(r.slot) : "" }), timeCell(r.created_at),
      el("td", { className: "num", textContent: r.started_at && ended ? duration(ended - r.started_at) : "" }));
    return row;
  });
  if (!rows.length) rows.push(el("tr", { className: "empty" }, el("td", { colSpan: 5, textContent: "It has fired no run yet." })));
  swap($("#schedule-runs tbody"), rows);
}

if (token) start(); else askToken("");
