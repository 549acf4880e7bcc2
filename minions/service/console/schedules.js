// The schedules: when each fires, paused and resumed; a schedule's runs.

import { api, inProject } from "./api.js";
import { $, el, statusBadge, swap } from "./dom.js";
import { absolute, interval, number } from "./format.js";
import { timeCell, took } from "./list.js";
import { state } from "./state.js";

// Why a schedule is flagged late (its `late_reason`).
const LATE = {
  late: "a slot fired over a minute after its time",
  overlap: "slots skipped while a run of it was active",
  "catch-up": "slots missed while no worker ran, skipped by its catch-up policy",
  backlog: "missed slots beyond the catch-up backlog skipped",
};

export function showSchedules(name) {
  state.schedule = name;
  $("#schedule-runs").hidden = !name;
  if (name) $("#schedule-runs tbody").replaceChildren();
  refreshSchedules();
}

export async function refreshSchedules() {
  let schedules;
  const project = state.project;
  try { schedules = await api(inProject("/schedules")); } catch (error) { $("#schedules-error").textContent = error.message; return; }
  if (project !== state.project) return; // another project was picked meanwhile
  $("#schedules-error").textContent = "";
  const rows = schedules.map((s) => {
    const row = el("tr", { className: s.name === state.schedule ? "chosen" : "" });
    row.dataset.schedule = s.name;
    row.dataset.paused = String(s.paused);
    row.dataset.project = s.project;
    const when = s.cron ? `cron ${s.cron}${s.timezone && s.timezone !== "UTC" ? ` (${s.timezone})` : " (UTC)"}` : `every ${interval(s.every)}`;
    row.dataset.late = String(s.late);
    const status = el("td", {}, el("span", { className: `status ${s.paused ? "s-paused" : "s-active"}`, textContent: s.paused ? "paused" : "active" }));
    if (s.late) status.append(" ", el("span", { className: "status s-late", textContent: "late", title: `${LATE[s.late_reason] || s.late_reason}; ${number(s.late_slots)} slot(s) late or skipped in all` }));
    const last = s.last_fired_at ? timeCell(s.last_fired_at) : el("td", { className: "muted", textContent: "never" });
    if (s.last_run_id) last.append(el("div", {}, el("a", { href: `#/runs/${s.last_run_id}`, className: "mono last-run", textContent: s.last_run_id.slice(0, 12), title: s.last_run_id })));
    const toggle = el("button", { type: "button", className: s.paused ? "resume" : "pause", textContent: s.paused ? "resume" : "pause" });
    toggle.addEventListener("click", async () => {
      try { await api(`/schedules/${encodeURIComponent(s.name)}/${s.paused ? "resume" : "pause"}`, { method: "POST" }); }
      catch (error) { $("#schedules-error").textContent = error.message; }
      await refreshSchedules();
    });
    row.append(
      el("td", {}, el("a", { href: `#/schedules/${encodeURIComponent(s.name)}`, textContent: s.name, title: "its runs" }), el("div", { className: "proj proj-tag", textContent: s.project })),
      el("td", { className: "wide", textContent: s.recipe }),
      el("td", { className: "mono small" }, when, el("div", { className: "muted overlap", textContent: `overlap ${s.overlap}` })),
      status,
      s.paused ? el("td", { className: "muted", textContent: "—" }) : timeCell(s.next_at),
      last,
      el("td", { className: "num", textContent: number(s.fired) }),
      el("td", {}, toggle),
    );
    return row;
  });
  if (!rows.length) rows.push(el("tr", { className: "empty" }, el("td", { colSpan: 8, textContent: "No schedules. Add one with `minions schedules add RECIPE --every 1h` or POST /schedules." })));
  swap($("#schedules tbody"), rows);
  if (state.schedule) await refreshScheduleRuns(state.schedule);
}

async function refreshScheduleRuns(name) {
  let detail;
  try { detail = await api(`/schedules/${encodeURIComponent(name)}`); }
  catch (error) { $("#schedule-runs-title").textContent = error.message; return; }
  if (state.schedule !== name) return;
  $("#schedule-runs-title").textContent = `runs of ${name} (${detail.runs.length}${detail.fired > detail.runs.length ? ` of ${number(detail.fired)}` : ""})`;
  const rows = detail.runs.map((r) => {
    const row = el("tr");
    row.dataset.run = r.run_id;
    row.append(el("td", {}, el("a", { href: `#/runs/${r.run_id}`, className: "mono", textContent: r.run_id.slice(0, 12), title: r.run_id })),
      el("td", {}, statusBadge(r.status)), el("td", { textContent: r.slot ? absolute(r.slot) : "" }), timeCell(r.created_at),
      el("td", { className: "num", textContent: took(r) }));
    return row;
  });
  if (!rows.length) rows.push(el("tr", { className: "empty" }, el("td", { colSpan: 5, textContent: "It has fired no run yet." })));
  swap($("#schedule-runs tbody"), rows);
}
