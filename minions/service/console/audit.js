// The audit log (admins): who changed what, when, from where and in which project, filtered, a
// page at a time.

import { api } from "./api.js";
import { $, el, swap } from "./dom.js";
import { timeCell } from "./list.js";
import { AUDIT_ACTIONS } from "./names.js";
import { state } from "./state.js";

const AUDIT_PAGE = 50;
state.audit = { cursors: [null], next: null, typing: null };

export function showAudit() {
  $("#audit-view").hidden = false;
  refreshAudit();
}

function filters() {
  const params = new URLSearchParams();
  const actor = $("#a-actor").value.trim();
  if (actor) params.set("actor", actor);
  const project = $("#a-project").value.trim();
  if (project) params.set("project", project);
  if ($("#a-action").value) params.set("action", $("#a-action").value);
  const since = $("#a-since").value;
  if (since) params.set("since", String(Math.floor(Date.now() / 1000 - Number(since))));
  if (state.project) params.set("project", state.project);
  return params;
}

function detail(entry) {
  return Object.entries(entry.detail).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(" ");
}

function target(entry) {
  // A run's id links to the run (it may have been pruned since).
  if (entry.action.startsWith("run.") || entry.action.startsWith("approval.")) {
    return el("a", { href: `#/runs/${entry.target}`, className: "mono", textContent: entry.target.slice(0, 12), title: entry.target });
  }
  return el("span", { className: "mono", textContent: entry.target });
}

export async function refreshAudit() {
  const audit = state.audit;
  const params = filters();
  params.set("limit", String(AUDIT_PAGE));
  const cursor = audit.cursors[audit.cursors.length - 1];
  if (cursor) params.set("cursor", String(cursor));
  let page;
  const project = state.project;
  try { page = await api(`/audit?${params}`); } catch (error) {
    $("#audit-error").textContent = error.message;
    return;
  }
  if (project !== state.project) return; // another project was picked meanwhile
  $("#audit-error").textContent = "";
  audit.next = page.next_cursor;
  const rows = page.entries.map((e) => {
    const row = el("tr");
    row.dataset.action = e.action;
    row.append(
      timeCell(e.at),
      el("td", { textContent: e.actor || "unknown" }),
      el("td", {}, el("span", { className: `action a-${e.action.split(".")[0]}`, textContent: e.action })),
      el("td", {}, target(e)),
      el("td", { textContent: e.project }),
      el("td", { className: "wide muted", textContent: e.address || "" }),
      el("td", { className: "wide clip", textContent: detail(e), title: detail(e) }),
    );
    return row;
  });
  if (!rows.length) rows.push(el("tr", { className: "empty" }, el("td", { colSpan: 7, textContent: "No changes match." })));
  swap($("#audit tbody"), rows);
  $("#audit-newer").disabled = audit.cursors.length === 1;
  $("#audit-older").disabled = !page.next_cursor;
}

function filtersChanged() { state.audit.cursors = [null]; refreshAudit(); }

$("#a-action").append(...[...new Set(AUDIT_ACTIONS.map((a) => a.split(".")[0]))].map((f) => el("option", { value: f, textContent: `${f}.*` })),
  ...AUDIT_ACTIONS.map((a) => el("option", { textContent: a })));
for (const id of ["#a-actor", "#a-project"]) $(id).addEventListener("input", () => { clearTimeout(state.audit.typing); state.audit.typing = setTimeout(filtersChanged, 250); });
for (const id of ["#a-action", "#a-since"]) $(id).addEventListener("change", filtersChanged);
$("#audit-filters").addEventListener("submit", (event) => { event.preventDefault(); filtersChanged(); });
$("#audit-filters").addEventListener("reset", () => setTimeout(filtersChanged, 0));
$("#audit-older").addEventListener("click", () => { if (state.audit.next) { state.audit.cursors.push(state.audit.next); refreshAudit(); } });
$("#audit-newer").addEventListener("click", () => { if (state.audit.cursors.length > 1) { state.audit.cursors.pop(); refreshAudit(); } });
