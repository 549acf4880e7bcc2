// One run: its head (status, recipe, times, usage, cancel and resume), the calls it waits for,
// its lineage, and the panes drawn from the server's fold of its events: the timeline, the
// graph, the steps, the error.

import { api } from "./api.js";
import { $, el, statusBadge } from "./dom.js";
import { absolute, clipped, duration, number, relative, tokensOf } from "./format.js";
import { renderGraph } from "./graph.js";
import { compareWith, renderLineage } from "./rerun.js";
import { renderError, renderSteps } from "./steps.js";
import { TERMINAL, newRun, state } from "./state.js";
import { follow } from "./stream.js";
import { renderTimeline } from "./timeline.js";

const page = { refresh: refreshRun, render };

export function stopRun() {
  const run = state.run;
  if (run) {
    if (run.source) run.source.close();
    clearInterval(run.ticker);
  }
  state.run = null;
}

export async function showRun(runId, against = null) {
  stopRun();
  const run = newRun(runId);
  state.run = run;
  $("#run-view").hidden = false;
  $("#run-id").textContent = runId;
  for (const id of ["#events", "#approvals", "#steps tbody", "#timeline", "#graph"]) $(id).replaceChildren();
  $("#tokens").replaceChildren(el("p", { className: "muted small", textContent: "A model's answer appears here as it is written." }));
  $("#event-count").textContent = "";
  $("#timeline-span").textContent = "";
  $("#run-error").hidden = true;
  $("#lineage").hidden = true;
  $("#diff").hidden = true;
  $("#run-output").textContent = "";
  window.scrollTo(0, 0);
  await refreshRun(run);
  if (against && state.run === run) {
    compareWith(run, against, `compared with the baseline's run ${against.slice(0, 12)}`, "baseline");
  }
  run.ticker = setInterval(() => { if (state.run === run && !run.ended && run.data && !TERMINAL.has(run.data.status)) render(run); }, 1000);
  follow(run, page);
}

// A run the server does not know (or not to this key): said, and nothing of the run shown
// before it stays on the page.
function unknownRun(error) {
  $("#run-recipe").textContent = error.message;
  $("#run-status").replaceWith(el("span", { id: "run-status", className: "status" }));
  for (const id of ["#run-times", "#run-usage"]) $(id).textContent = "";
  $("#cancel").disabled = true;
  $("#resume").disabled = true;
}

async function refreshRun(run) {
  let data;
  try { data = await api(`/runs/${encodeURIComponent(run.id)}`); } catch (error) { unknownRun(error); return; }
  if (state.run !== run) return;
  run.data = data;
  run.records = new Map(data.steps.map((s) => [s.step_id, s]));
  // The run's own times once it has them (its events' until then): the same watched live as
  // read later.
  run.startedAt = data.started_at || run.startedAt || data.created_at;
  run.endedAt = data.finished_at || run.endedAt;
  $("#run-status").replaceWith(Object.assign(statusBadge(data.outcome, data.rejected_by), { id: "run-status" }));
  // Its project, for a token of several (or when it is not `default`).
  $("#run-recipe").textContent = data.project && (state.projects.length > 1 || data.project !== "default") ? `${data.recipe} · project ${data.project}` : data.recipe;
  $("#run-recipe").dataset.project = data.project || "";
  const end = data.finished_at || (TERMINAL.has(data.status) ? null : Date.now() / 1000);
  $("#run-times").textContent = [`created ${relative(data.created_at)} (${absolute(data.created_at)})`, data.started_at && end ? `${data.finished_at ? "took" : "running for"} ${duration(end - data.started_at)}` : ""].filter(Boolean).join(" · ");
  const u = data.usage || {};
  $("#run-usage").textContent = u.calls ? `${u.calls} model calls, ${number(tokensOf(u))} tokens (${number(u.prompt_tokens || 0)} in, ${number(u.completion_tokens || 0)} out)` : "";
  $("#cancel").disabled = TERMINAL.has(data.status);
  $("#resume").disabled = !(data.status === "failed" || data.status === "cancelled");
  $("#run-output").textContent = data.output === null || data.output === undefined ? "—" : clipped(data.output, 20000);
  renderApprovals(run, data.approvals.filter((a) => a.decided_at === null));
  renderDecisions(data.approvals.filter((a) => a.decided_at !== null));
  renderLineage(data);
  render(run);
}

function render(run) {
  // The panes of the steps are what the server folded of the run's events: drawn once it has
  // (from the states of the run's stream), never from a guess before.
  if (!run.folded) return;
  renderTimeline(run);
  renderGraph(run);
  renderSteps(run);
  renderError(run);
}

function renderApprovals(run, waiting) {
  // A call still waiting keeps its box, so a reason being typed is not wiped by a redraw.
  const shown = new Map([...$("#approvals").children].map((box) => [box.dataset.call, box]));
  const boxes = waiting.map((a) => {
    if (shown.has(a.call_id) && shown.get(a.call_id).dataset.run === run.id) return shown.get(a.call_id);
    const box = el("div", { className: "approval" });
    box.dataset.run = run.id;
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

function renderDecisions(decided) {
  // Each decision made on the run's calls: what, by whom, when, and the person's reason.
  $("#decisions").replaceChildren(...decided.map((a) => {
    const item = el("li", { className: a.approved ? "approved" : "rejected" });
    item.dataset.call = a.call_id;
    item.append(
      el("strong", { textContent: a.decided_by || "someone" }),
      ` ${a.approved ? "approved" : "rejected"} `,
      el("code", { textContent: a.tool }),
      ` in step ${a.step_id}`,
      el("span", { className: "muted", textContent: ` · ${relative(a.decided_at)}` }),
    );
    if (a.reason) item.append(el("span", { className: "reason", textContent: ` — ${a.reason}` }));
    return item;
  }));
}

// Cancel asks first, naming the run; "keep it" has the focus, so Enter or Escape keeps it.
$("#cancel").addEventListener("click", () => {
  const run = state.run;
  if (!run || !run.data) return;
  const dialog = $("#cancel-dialog");
  dialog.dataset.run = run.id;
  $("#cancel-what").replaceChildren("Run ", el("code", { textContent: run.id }), ` of ${run.data.recipe}, ${run.data.status}${run.data.started_at ? ` for ${duration(Date.now() / 1000 - run.data.started_at)}` : ""}.`);
  $("#cancel-error").textContent = "";
  dialog.showModal();
  $("#cancel-keep").focus();
});
$("#cancel-keep").addEventListener("click", () => $("#cancel-dialog").close());
$("#cancel-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const run = state.run;
  const dialog = $("#cancel-dialog");
  if (!run || dialog.dataset.run !== run.id) { dialog.close(); return; }
  $("#cancel-confirm").disabled = true;
  try {
    await api(`/runs/${encodeURIComponent(run.id)}/cancel`, { method: "POST" });
    dialog.close();
  } catch (error) {
    $("#cancel-error").textContent = error.message;
  } finally { $("#cancel-confirm").disabled = false; }
  await refreshRun(run);
});
$("#resume").addEventListener("click", async () => {
  const run = state.run;
  if (!run) return;
  try { await api(`/runs/${run.id}/resume`, { method: "POST" }); } catch {}
  await refreshRun(run);
  if (run.ended) { run.ended = false; follow(run, page); }
});
