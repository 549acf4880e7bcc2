// A rerun from a step (its inputs, and a reused step's output, edited first); a rerun's
// lineage, and its differences from its parent.

import { api } from "./api.js";
import { $, el, statusBadge, swap } from "./dom.js";
import { absolute, clipped, duration, number } from "./format.js";
import { state, stepStatus } from "./state.js";

export function renderLineage(data) {
  const parts = [];
  if (data.parent_run_id) {
    parts.push("Rerun of run ", el("a", { href: `#/runs/${data.parent_run_id}`, className: "mono parent", textContent: data.parent_run_id.slice(0, 12), title: data.parent_run_id }),
      " from step ", el("code", { textContent: data.from_step || "?" }), " ",
      el("button", { type: "button", id: "compare", textContent: "compare with parent", onclick: () => compare(state.run) }));
  }
  if (data.schedule) {
    if (parts.length) parts.push(" · ");
    parts.push("Fired by schedule ", el("a", { href: `#/schedules/${encodeURIComponent(data.schedule)}`, textContent: data.schedule }), data.slot ? ` for ${absolute(data.slot)}` : "");
  }
  $("#lineage").hidden = !parts.length;
  swap($("#lineage"), parts);
}

function compare(run) {
  if (!run || !run.data || !run.data.parent_run_id) return;
  compareWith(run, run.data.parent_run_id, "compared with its parent", "parent");
}

export async function compareWith(run, other, title, label) {
  // The run's differences from `other` (its parent, or the baseline's run of an eval case).
  const box = $("#diff");
  box.hidden = false;
  $("#diff-what").textContent = title;
  $("#diff-first").replaceChildren(el("span", { className: "muted", textContent: "comparing…" }));
  let diff;
  try { diff = await api(`/runs/${encodeURIComponent(other)}/diff/${encodeURIComponent(run.id)}`); }
  catch (error) { $("#diff-first").replaceChildren(el("span", { className: "error", textContent: error.message })); return; }
  if (state.run !== run) return;
  const first = diff.first_divergence;
  $("#diff-first").replaceChildren(first
    ? el("strong", {}, "First divergence: step ", el("code", { textContent: first }))
    : el("strong", { textContent: "No divergence: both runs did the same." }));
  $("#diff-summary").textContent = `${label} ${diff.status[0]}, ${number(diff.tokens[0])} tokens, ${diff.calls[0]} calls · this run ${diff.status[1]}, ${number(diff.tokens[1])} tokens, ${diff.calls[1]} calls`;
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

export function openRerun(run, stepId) {
  if (!run || !run.data) return;
  const dialog = $("#rerun-dialog");
  dialog.dataset.step = stepId;
  $("#rerun-step").textContent = stepId;
  $("#rerun-title").textContent = `rerun from step ${stepId}`;
  $("#rerun-inputs").value = JSON.stringify(run.data.inputs || {}, null, 2);
  $("#rerun-error").textContent = "";
  const graph = run.data.graph;
  const later = downstream(graph, stepId);
  const reusable = graph.map((n) => n.id).filter((id) => id !== stepId && !later.has(id) && ["completed", "reused"].includes(stepStatus(run, id)));
  $("#rerun-set").replaceChildren(el("option", { value: "", textContent: "— none —" }), ...reusable.map((id) => el("option", { value: id, textContent: id })));
  $("#rerun-output-label").hidden = true;
  $("#rerun-output").value = "";
  dialog.showModal();
  $("#rerun-inputs").focus();
}

$("#rerun-set").addEventListener("change", () => {
  const id = $("#rerun-set").value;
  $("#rerun-output-label").hidden = !id;
  const record = id && state.run ? state.run.records.get(id) : null;
  $("#rerun-output").value = record ? JSON.stringify(record.output, null, 2) : "";
});
$("#rerun-cancel").addEventListener("click", () => $("#rerun-dialog").close());
$("#rerun-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const run = state.run;
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
