// The runs list: filtered (and narrowed to the project picked), a page at a time, newest
// first, each run's project beside its recipe for a token of several; and a new run's form.

import { api, inProject } from "./api.js";
import { $, el, statusBadge, swap } from "./dom.js";
import { absolute, duration, forPerson, number, relative, tokensOf } from "./format.js";
import { RUN_STATUSES } from "./names.js";
import { PAGE, TERMINAL, state } from "./state.js";

export function timeCell(t) {
  const cell = el("td", { className: "when" });
  if (!t) return cell;
  cell.append(el("time", { dateTime: new Date(t * 1000).toISOString(), title: new Date(t * 1000).toString(), textContent: relative(t) }),
    el("div", { className: "muted small", textContent: absolute(t) }));
  return cell;
}

export function took(run) {
  // How long a run took, or has been running.
  const ended = run.finished_at || (TERMINAL.has(run.status) ? null : Date.now() / 1000);
  return run.started_at && ended ? duration(ended - run.started_at) : "";
}

async function recipesOf(project) {
  // The recipes `project` is offered (its own folder's, or the server's); null: the token's
  // only project's, or the server's for a token of several.
  return api(project ? `/recipes?project=${encodeURIComponent(project)}` : "/recipes");
}

function offer(recipes) {
  const chosen = $("#recipe").value;
  $("#recipe").replaceChildren(...recipes.map((r) => el("option", { value: r.id, textContent: r.description ? `${r.id} — ${r.description}` : r.id })));
  if (recipes.some((r) => r.id === chosen)) $("#recipe").value = chosen;
}

export async function loadRecipes() {
  // The recipes of the project picked: the filter's, and the new run form's (which submits
  // into the project picked, or asks which one under "all projects").
  const recipes = await recipesOf(state.project);
  state.list.recipes = recipes.map((r) => r.id);
  const filtered = $("#f-recipe").value;
  $("#f-recipe").replaceChildren(el("option", { value: "", textContent: "any" }), ...recipes.map((r) => el("option", { value: r.id, textContent: r.id })));
  if (state.list.recipes.includes(filtered)) $("#f-recipe").value = filtered;
  const several = state.projects.length > 1;
  $("#submit-project-label").hidden = !several;
  $("#submit-project").replaceChildren(el("option", { value: "", textContent: "choose…" }), ...state.projects.map((p) => el("option", { value: p, textContent: p })));
  $("#submit-project").value = state.project || "";
  $("#submit-project").required = several;
  offer(recipes);
}

$("#submit-project").addEventListener("change", async () => {
  $("#submit-error").textContent = "";
  try { offer(await recipesOf($("#submit-project").value)); } catch (error) { $("#submit-error").textContent = error.message; }
});

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

export async function refreshList() {
  const list = state.list;
  const params = filters();
  params.set("limit", String(PAGE));
  const cursor = list.cursors[list.cursors.length - 1];
  if (cursor) params.set("cursor", cursor);
  const mine = ++list.refreshing;
  let page;
  try { page = await api(inProject(`/runs?${params}`)); } catch (error) {
    $("#connection").textContent = error.status ? error.message : "disconnected";
    return;
  }
  if (mine !== list.refreshing) return; // a newer refresh (other filters) was asked for meanwhile
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
    row.dataset.outcome = r.outcome;
    row.dataset.project = r.project;
    const link = el("a", { href: `#/runs/${r.run_id}`, className: "mono", textContent: r.run_id.slice(0, 12), title: r.run_id });
    row.append(
      el("td", {}, link),
      el("td", {}, statusBadge(r.outcome, r.rejected_by)),
      el("td", { className: "wide", textContent: r.recipe }),
      el("td", { className: "proj", textContent: r.project }),
      timeCell(r.created_at),
      el("td", { className: "num", textContent: took(r) }),
      el("td", { className: "num wide", textContent: number(tokensOf(r.usage)) }),
      el("td", { className: "wide clip error", textContent: r.status === "failed" ? forPerson(r.error, 90) : "", title: r.status === "failed" ? forPerson(r.error, 400) : "" }),
    );
    row.addEventListener("click", (event) => { if (event.target.tagName !== "A") location.hash = `#/runs/${r.run_id}`; });
    return row;
  });
  if (!rows.length) rows.push(el("tr", { className: "empty" }, el("td", { colSpan: 8, textContent: "No runs match." })));
  swap($("#runs tbody"), rows);
  const first = (list.cursors.length - 1) * PAGE;
  $("#page-info").textContent = page.runs.length ? `${first + 1}–${first + page.runs.length} of ${number(page.total)}` : `0 of ${number(page.total)}`;
  $("#newer").disabled = list.cursors.length === 1;
  $("#older").disabled = !page.next_cursor;
}

function filtersChanged() { state.list.cursors = [null]; refreshList(); }

// The statuses a run may be in, as the server lists them.
$("#f-status").append(...RUN_STATUSES.map((s) => el("option", { textContent: s })));
$("#f-id").addEventListener("input", () => { clearTimeout(state.list.typing); state.list.typing = setTimeout(filtersChanged, 250); });
for (const id of ["#f-status", "#f-recipe", "#f-since", "#f-from", "#f-to"]) $(id).addEventListener("change", filtersChanged);
$("#filters").addEventListener("submit", async (event) => {
  // Enter in the search box: straight to the run when one run has that id prefix.
  event.preventDefault();
  clearTimeout(state.list.typing);
  state.list.cursors = [null];
  await refreshList();
  const rows = document.querySelectorAll("#runs tbody tr[data-run]");
  if (rows.length === 1 && $("#f-id").value.trim()) location.hash = `#/runs/${rows[0].dataset.run}`;
});
$("#filters").addEventListener("reset", () => setTimeout(filtersChanged, 0));
$("#older").addEventListener("click", () => { if (state.list.next) { state.list.cursors.push(state.list.next); refreshList(); } });
$("#newer").addEventListener("click", () => { if (state.list.cursors.length > 1) { state.list.cursors.pop(); refreshList(); } });

$("#submit-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  $("#submit-error").textContent = "";
  let inputs;
  try { inputs = JSON.parse($("#inputs").value || "{}"); } catch { $("#submit-error").textContent = "inputs: not JSON"; return; }
  try {
    const body = { recipe: $("#recipe").value, inputs };
    // Into the project chosen (the token's one project, when it has one).
    if (state.projects.length) body.project = state.projects.length > 1 ? $("#submit-project").value : state.projects[0];
    const made = await api("/runs", { method: "POST", body: JSON.stringify(body) });
    location.hash = `#/runs/${made.run_id}`;
  } catch (error) { $("#submit-error").textContent = error.message; }
});
