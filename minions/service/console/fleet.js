// The fleet: the workers (alive or dead, places used of their own, the runs each holds, version,
// last heartbeat), the model endpoints (in flight, waiting, the last minute's requests and
// tokens, a 429's pause, the output mode each model taught), the queue (backlog, oldest
// queued) and the usage totals (tokens and cost by day, recipe, schedule, model or project,
// of the key's projects only: the server narrows them; an unknown price is said unknown,
// never $0). The notifications' deliveries are under the workers. The workers' runs, the
// queue and the usage are the project picked's.

import { api, inProject } from "./api.js";
import { $, el, swap } from "./dom.js";
import { duration, number } from "./format.js";
import { timeCell } from "./list.js";
import { state } from "./state.js";

const VIEWS = ["workers", "endpoints", "queue", "usage"];

export function showFleet(view) {
  state.fleet = view;
  for (const name of VIEWS) $(`#${name}-pane`).hidden = name !== view;
  refreshFleet();
}

export async function refreshFleet() {
  const view = state.fleet;
  try {
    if (view === "workers") await workers();
    else if (view === "endpoints") await endpoints();
    else if (view === "queue") await queue();
    else if (view === "usage") await usage();
    $("#fleet-error").textContent = "";
  } catch (error) {
    $("#fleet-error").textContent = error.message;
  }
}

const cell = (text, className = "") => el("td", { className, textContent: text === null || text === undefined ? "" : String(text) });
const empty = (columns, text) => el("tr", { className: "empty" }, el("td", { colSpan: columns, textContent: text }));
const ago = (t) => duration(Math.max(0, Date.now() / 1000 - t));

function runLinks(runs) {
  const td = el("td", { className: "mono small" });
  runs.forEach((run, i) => {
    if (i) td.append(" ");
    td.append(el("a", { href: `#/runs/${run}`, textContent: run.slice(0, 12), title: run }));
  });
  return td;
}

async function workers() {
  const project = state.project;
  const [found, deliveries] = await Promise.all([api(inProject("/workers")), api("/notifications")]);
  if (project !== state.project) return; // another project was picked meanwhile
  const alive = found.filter((w) => w.alive).length;
  const dead = found.filter((w) => !w.alive && w.stopped_at === null).length;
  $("#workers-summary").textContent = `${alive} alive, ${dead} dead`;
  const rows = found.map((w) => {
    const stateText = w.stopped_at !== null ? "stopped" : w.alive ? "alive" : "dead";
    const row = el("tr", { className: `worker-${stateText}` });
    row.dataset.worker = w.executor_id;
    row.append(
      cell(w.executor_id, "mono"),
      el("td", {}, el("span", { className: `status w-${stateText}`, textContent: stateText })),
      cell(`${w.runs.length} / ${w.places === null ? "?" : w.places}`, "num places"),
      runLinks(w.runs),
      cell(w.version, "mono small"),
      cell(`${w.host || "?"}:${w.pid || "?"}`, "mono small wide"),
      el("td", { className: "when", textContent: `${ago(w.heartbeat_at)} ago`, title: new Date(w.heartbeat_at * 1000).toString() }),
    );
    return row;
  });
  if (!rows.length) rows.push(empty(7, "No worker has run on this store. Start one with `minions worker`."));
  swap($("#workers tbody"), rows);
  const targets = deliveries.map((d) => {
    const row = el("tr");
    row.dataset.target = d.target;
    row.append(
      cell(d.target, "mono small"),
      cell(d.delivered, "num"),
      cell(d.pending, "num"),
      cell(d.failed, "num"),
      d.last_delivered_at ? timeCell(d.last_delivered_at) : cell("never", "muted"),
      cell(d.last_error || "", d.last_error ? "error small" : ""),
    );
    return row;
  });
  if (!targets.length) targets.push(empty(6, "No notification sent. Give `--notify URL` to `minions serve` or `minions worker`."));
  swap($("#notifications tbody"), targets);
}

async function endpoints() {
  const found = await api("/endpoints/status");
  const now = Date.now() / 1000;
  const rows = found.map((e) => {
    const row = el("tr");
    row.dataset.endpoint = e.endpoint;
    const modes = e.learned.map((l) => `${l.model}: ${l.output_mode || "?"}${l.rejected.length ? ` (refused ${l.rejected.join(", ")})` : ""}`).join("; ");
    const load = e.load;
    if (!load) {
      row.append(cell(e.endpoint, "mono"), cell("no limits", "muted"), cell(""), cell(""), cell(""), cell(""), cell(""), cell(modes, "small learned"));
      return row;
    }
    const full = load.waiting > 0;
    const paused = load.paused_until > now ? `${duration(load.paused_until - now)} more` : "";
    row.className = full || paused ? "saturated" : "";
    row.append(
      cell(e.endpoint, "mono"),
      el("td", {}, el("span", { className: `status ${paused ? "e-paused" : full ? "e-saturated" : "e-ok"}`, textContent: paused ? "paused (429)" : full ? "saturated" : "ok" })),
      cell(load.in_flight, "num in-flight"),
      cell(load.waiting, "num waiting"),
      cell(number(load.requests), "num"),
      cell(number(load.tokens), "num"),
      cell(paused, "num"),
      cell(modes || "—", `small learned${modes ? "" : " muted"}`),
    );
    return row;
  });
  if (!rows.length) rows.push(empty(8, "No limited endpoint (`--limits`), and no endpoint taught anything yet."));
  swap($("#endpoints tbody"), rows);
}

async function queue() {
  const project = state.project;
  const q = await api(inProject("/queue?limit=20"));
  if (project !== state.project) return;
  $("#queue-summary").replaceChildren(
    el("span", { className: "big", id: "queue-queued", textContent: number(q.queued) }), " queued",
    q.queued ? el("span", {}, ", the oldest for ", el("strong", { id: "queue-oldest", textContent: duration(q.oldest_queued_seconds) })) : "",
    ` · ${number(q.running)} running · ${number(q.waiting)} waiting for approval`,
  );
  const recipes = q.by_recipe.map((r) => el("tr", {}, cell(r.recipe), cell(number(r.queued), "num"), cell(`${ago(r.oldest_queued_at)}`, "num")));
  if (!recipes.length) recipes.push(empty(3, "Nothing queued: every run has a worker."));
  swap($("#queue-recipes tbody"), recipes);
  const runs = q.oldest.map((r) => el("tr", {}, runLinks([r.run_id]), cell(r.recipe_id), cell(r.schedule || ""), timeCell(r.created_at)));
  if (!runs.length) runs.push(empty(4, "Nothing queued."));
  swap($("#queue-runs tbody"), runs);
}

// Dollars: cents from a dollar up, two significant digits below (never a cost shown as $0.00).
const money = (cost) => (cost === null ? "unknown" : cost >= 0.995 || cost === 0 ? `$${cost.toFixed(2)}` : `$${Number(cost.toPrecision(2))}`);

async function usage() {
  const since = $("#usage-since").value;
  const by = $("#usage-by").value;
  const project = state.project;
  const report = await api(inProject(`/usage?since=${encodeURIComponent(since)}&group_by=${encodeURIComponent(by)}`));
  if (project !== state.project) return;
  const groups = report.group_by;
  $("#usage-head").replaceChildren(...[...groups, "prompt tokens", "answer tokens", "calls", "cost", "unpriced calls"].map((h, i) => el("th", { className: i >= groups.length ? "num" : "", textContent: h })));
  const line = (r, keys, className = "") => {
    const row = el("tr", { className });
    for (const k of keys) row.append(cell(k));
    row.append(
      cell(number(r.prompt_tokens), "num"),
      cell(number(r.completion_tokens), "num"),
      cell(`${number(r.calls)}${r.unknown_calls ? ` (${number(r.unknown_calls)} unreported)` : ""}`, "num"),
      cell(money(r.cost), `num cost${r.cost === null ? " muted" : ""}`),
      cell(r.unpriced_calls ? number(r.unpriced_calls) : "", "num unpriced"),
    );
    return row;
  };
  const rows = report.rows.map((r) => line(r, groups.map((g) => r[g] ?? (g === "schedule" ? "(by hand)" : "?"))));
  if (!rows.length && groups.length) rows.push(empty(groups.length + 5, "No model call in this span."));
  rows.push(line(report.total, groups.length ? ["total", ...groups.slice(1).map(() => "")] : [], "total"));
  swap($("#usage tbody"), rows);
  $("#usage-prices").textContent = `Prices: ${report.prices}. A model or endpoint the table does not know (a server of your own) is unpriced, never $0.`;
}

for (const id of ["#usage-since", "#usage-by"]) $(id).addEventListener("change", () => refreshFleet());
