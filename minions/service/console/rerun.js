// A rerun from a step (its inputs, and a reused step's output, edited first, with the server's
// plan of what it reuses); a rerun's lineage, and its differences from its parent.

import { api } from "./api.js";
import { $, el, statusBadge, swap } from "./dom.js";
import { absolute, clipped, duration, number } from "./format.js";
import { state } from "./state.js";

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

export function openRerun(run, stepId) {
  if (!run || !run.data) return;
  const dialog = $("#rerun-dialog");
  dialog.dataset.step = stepId;
  $("#rerun-step").textContent = stepId;
  $("#rerun-title").textContent = `rerun from step ${stepId}`;
  $("#rerun-inputs").value = JSON.stringify(run.data.inputs || {}, null, 2);
  $("#rerun-error").textContent = "";
  $("#rerun-set").replaceChildren(el("option", { value: "", textContent: "— none —" }));
  $("#rerun-output-label").hidden = true;
  $("#rerun-output").value = "";
  $("#rerun-plan").replaceChildren(el("span", { className: "muted", textContent: "asking the server what it would reuse…" }));
  dialog.showModal();
  $("#rerun-inputs").focus();
  preview();
}

function asked() {
  // The rerun the editor describes ({body}), or what is wrong in it ({error}).
  const body = { from_step: $("#rerun-dialog").dataset.step };
  try { body.inputs = JSON.parse($("#rerun-inputs").value || "{}"); } catch { return { error: "The inputs are not valid JSON." }; }
  if (typeof body.inputs !== "object" || body.inputs === null || Array.isArray(body.inputs)) return { error: "The inputs must be a JSON object, like {\"text\": \"hi\"}." };
  const set = $("#rerun-set").value;
  if (set) {
    try { body.outputs = { [set]: JSON.parse($("#rerun-output").value) }; }
    catch { return { error: `The new output of step ${set} is not valid JSON (a text goes in quotes).` }; }
  }
  return { body };
}

// The server's plan of the rerun the editor describes (POST /runs/{id}/rerun/preview: its own
// rule, with the inputs and outputs as edited): what it reuses, what it runs again and why,
// and which reused steps' outputs may be replaced. Only the latest answer is shown.
let previews = 0;
let typing = null;

function previewSoon() {
  $("#rerun-error").textContent = ""; // said of the editor as it was
  clearTimeout(typing);
  typing = setTimeout(preview, 300);
}

async function preview() {
  const run = state.run;
  const dialog = $("#rerun-dialog");
  const box = $("#rerun-plan");
  const made = asked();
  const mine = ++previews;
  if (made.error) { box.replaceChildren(el("span", { className: "muted", textContent: `${made.error} The plan shows once it is.` })); return; }
  const ask = (body) => api(`/runs/${encodeURIComponent(run.id)}/rerun/preview`, { method: "POST", body: JSON.stringify(body) });
  let plan;
  try {
    // The steps whose output may be replaced: of the rerun with no output replaced (one
    // replaced reruns what follows it, and another could be picked instead).
    const { outputs, ...plain } = made.body;
    const base = await ask(plain);
    if (mine !== previews || state.run !== run || !dialog.open) return;
    offer(base.editable);
    plan = outputs ? await ask(made.body) : base;
  } catch (error) {
    if (mine === previews && state.run === run) box.replaceChildren(el("span", { className: "error", textContent: `This rerun is not possible: ${error.message}` }));
    return;
  }
  if (mine !== previews || state.run !== run || !dialog.open) return;
  const why = (id) => (plan.changed[id] === "inputs" ? `${id} (its inputs changed)` : plan.changed[id] === "definition" ? `${id} (its definition changed)` : id);
  box.replaceChildren(
    el("div", { id: "rerun-reused" }, el("strong", { textContent: "reused as recorded: " }), plan.reused.join(", ") || "none"),
    el("div", { id: "rerun-again" }, el("strong", { textContent: "run again: " }), plan.rerun.map(why).join(", ")),
  );
}

function offer(editable) {
  // The reused steps whose output may be replaced, the one picked kept when it still is one.
  const select = $("#rerun-set");
  const picked = select.value;
  const now = [...select.options].slice(1).map((o) => o.value);
  if (now.join("\n") === editable.join("\n")) return;
  select.replaceChildren(el("option", { value: "", textContent: "— none —" }), ...editable.map((id) => el("option", { value: id, textContent: id })));
  select.value = editable.includes(picked) ? picked : "";
  if (select.value !== picked) { $("#rerun-output-label").hidden = true; $("#rerun-output").value = ""; }
}

$("#rerun-inputs").addEventListener("input", previewSoon);
$("#rerun-output").addEventListener("input", previewSoon);
$("#rerun-set").addEventListener("change", () => {
  const id = $("#rerun-set").value;
  $("#rerun-output-label").hidden = !id;
  const record = id && state.run ? state.run.records.get(id) : null;
  $("#rerun-output").value = record ? JSON.stringify(record.output, null, 2) : "";
  preview();
});
$("#rerun-cancel").addEventListener("click", () => $("#rerun-dialog").close());
$("#rerun-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const run = state.run;
  const say = (text) => { $("#rerun-error").textContent = text; };
  say("");
  const made = asked();
  if (made.error) { say(made.error); return; }
  $("#rerun-submit").disabled = true;
  try {
    const rerun = await api(`/runs/${encodeURIComponent(run.id)}/rerun`, { method: "POST", body: JSON.stringify(made.body) });
    $("#rerun-dialog").close();
    location.hash = `#/runs/${rerun.run_id}`;
  } catch (error) {
    if (error.type === "wrong_state") say(`This run cannot be rerun now: ${error.message}`);
    else if (error.type === "invalid_rerun") say(`This rerun is not possible: ${error.message}`);
    else say(error.message);
  } finally { $("#rerun-submit").disabled = false; }
});
