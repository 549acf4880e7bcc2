// The minions console: the runs, filtered and paged; a run's timeline (each step and loop
// item a bar from its start to its end, retries and waits marked), its graph, its steps, its
// events as they come (Server-Sent Events, through an EventSource opened with a stream ticket:
// the token stays in headers), its output and streaming text; a step's calls in a drawer;
// cancel (asked first), resume, approve, reject; rerun a finished run from a step (its inputs, and a reused
// step's output, edited first), a rerun's lineage and its differences from its parent; the
// schedules, paused and resumed; the evals' kept reports (a regressed case's run diffed
// against the baseline's); who the token is and the calls that wait for it; the audit log;
// a project picker for a token of several projects, which narrows every listing.
// A run a person rejected shows as `rejected`, with who rejected it. The fleet (workers,
// endpoints, queue) and the usage totals. ES modules, no build step, no dependencies. What a
// run's steps
// are is the server's fold of its events (the `states` of its stream), drawn as it is.
//
// This module: the token (asked for, kept in this tab only), and which view the address shows.

import { api } from "./api.js";
import { refreshAudit, showAudit } from "./audit.js";
import { $ } from "./dom.js";
import { closeDrawer } from "./drawer.js";
import { loadRecipes, refreshList } from "./list.js";
import { refreshMe } from "./me.js";
import { forgetProjects, loadProjects, onProjectChange } from "./projects.js";
import { showRun, stopRun } from "./run.js";
import { refreshEvals, showEvals } from "./evals.js";
import { refreshFleet, showFleet } from "./fleet.js";
import { refreshSchedules, showSchedules } from "./schedules.js";
import { setToken, state } from "./state.js";

function askToken(why) {
  setToken(null);
  stopRun();
  clearInterval(state.listTimer);
  $("#app").hidden = true;
  $("#forget").hidden = true;
  $("#me").hidden = true;
  $("#waiting").hidden = true;
  $("#nav-audit").hidden = true;
  forgetProjects();
  $("#login").hidden = false;
  $("#login-error").textContent = why || "";
  $("#token").focus();
}
state.refused = askToken;

$("#login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  setToken($("#token").value.trim());
  $("#token").value = "";
  await start();
});
$("#forget").addEventListener("click", () => askToken(""));

async function start() {
  try { await api("/runs?limit=1"); } catch (error) { if (error.status === 401) return; }
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#forget").hidden = false;
  await loadProjects();
  await Promise.all([loadRecipes(), refreshMe()]);
  clearInterval(state.listTimer);
  state.listTimer = setInterval(() => {
    refreshMe();
    if (!$("#audit-view").hidden && state.audit.cursors.length === 1) refreshAudit();
    if (!$("#list-view").hidden && state.list.cursors.length === 1) refreshList();
    if (!$("#schedules-view").hidden) refreshSchedules();
    if (!$("#evals-view").hidden) refreshEvals();
    if (!$("#fleet-view").hidden) refreshFleet();
  }, 2000);
  route();
}

function route() {
  const match = location.hash.match(/^#\/runs\/([^/]+)(?:\/diff\/([^/]+))?$/);
  const schedules = location.hash.match(/^#\/schedules(?:\/([^/]+))?$/);
  const evals = location.hash.match(/^#\/evals(?:\/([^/]+))?$/);
  const audit = location.hash === "#/audit";
  const fleet = location.hash.match(/^#\/(workers|endpoints|queue|usage)$/);
  closeDrawer(false);
  for (const dialog of ["#rerun-dialog", "#cancel-dialog"]) if ($(dialog).open) $(dialog).close();
  $("#schedules-view").hidden = !schedules;
  $("#evals-view").hidden = !evals;
  $("#audit-view").hidden = !audit;
  $("#fleet-view").hidden = !fleet;
  if (audit) {
    stopRun();
    $("#run-view").hidden = true;
    $("#list-view").hidden = true;
    showAudit();
  } else if (fleet) {
    stopRun();
    $("#run-view").hidden = true;
    $("#list-view").hidden = true;
    showFleet(fleet[1]);
  } else if (evals) {
    stopRun();
    $("#run-view").hidden = true;
    $("#list-view").hidden = true;
    showEvals(evals[1] ? decodeURIComponent(evals[1]) : null);
  } else if (schedules) {
    stopRun();
    $("#run-view").hidden = true;
    $("#list-view").hidden = true;
    showSchedules(schedules[1] ? decodeURIComponent(schedules[1]) : null);
  } else if (match) {
    $("#list-view").hidden = true;
    showRun(decodeURIComponent(match[1]), match[2] ? decodeURIComponent(match[2]) : null);
  } else {
    stopRun();
    $("#run-view").hidden = true;
    $("#list-view").hidden = false;
    refreshList();
  }
}
window.addEventListener("hashchange", () => { if (state.token) route(); });
onProjectChange(() => {
  // Another project picked: every listing from its first page, the run on screen kept.
  state.list.cursors = [null];
  state.audit.cursors = [null];
  refreshMe();
  loadRecipes().catch(() => {});
  if ($("#run-view").hidden) route();
});

if (state.token) start(); else askToken("");
