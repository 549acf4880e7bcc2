// A step's drawer: its calls, retries, approvals and completion decisions (GET
// /runs/{id}/steps/{step}), and its waits for a model endpoint (the server's fold).

import { api } from "./api.js";
import { $, el, statusBadge } from "./dom.js";
import { absolute, clipped, duration, forPerson, number, relative, tokensOf, waitText } from "./format.js";
import { openRerun } from "./rerun.js";
import { rerunnable, state, stepStatus } from "./state.js";

export async function openDrawer(run, stepId) {
  // The panes' handlers pass `state.run`, never the run they were drawn for: a pane that
  // `swap` kept (it showed the same) may have been drawn for another run.
  if (!run) return;
  state.opener = document.activeElement;
  const drawer = $("#drawer");
  drawer.hidden = false;
  drawer.dataset.step = stepId;
  $("#drawer-title").replaceChildren(`step ${stepId} `, statusBadge(stepStatus(run, stepId)));
  $("#drawer-body").replaceChildren(el("p", { className: "muted", textContent: "loading…" }));
  $("#drawer-close").focus();
  let detail;
  try { detail = await api(`/runs/${encodeURIComponent(run.id)}/steps/${encodeURIComponent(stepId)}`); }
  catch (error) { $("#drawer-body").replaceChildren(el("p", { className: "error", textContent: error.message })); return; }
  if (state.run !== run || drawer.dataset.step !== stepId) return;
  $("#drawer-title").replaceChildren(`step ${stepId} `, statusBadge(detail.status));
  const extra = [];
  if (rerunnable(run, stepId)) extra.push(el("p", {}, el("button", { type: "button", className: "rerun", textContent: "rerun from here", onclick: () => openRerun(state.run, stepId) })));
  const record = run.records.get(stepId);
  if (record && record.reused_from) {
    const cost = tokensOf(record.reused_usage);
    extra.push(el("p", { className: "reused-note" }, "Reused as recorded in run ", el("a", { href: `#/runs/${record.reused_from}`, className: "mono", textContent: record.reused_from.slice(0, 12), title: record.reused_from }),
      `: no model or tool call this time${cost ? ` (it cost ${number(cost)} tokens there)` : ""}.`));
  }
  $("#drawer-body").replaceChildren(...extra, ...stepDetail(detail), ...modelWaits(run, stepId));
}

export function closeDrawer(refocus = true) {
  const drawer = $("#drawer");
  if (drawer.hidden) return;
  drawer.hidden = true;
  drawer.dataset.step = "";
  if (refocus && state.opener && document.contains(state.opener)) state.opener.focus();
}
$("#drawer-close").addEventListener("click", () => closeDrawer());
// Escape in the rerun editor closes the editor only (the browser does), not the drawer under it.
document.addEventListener("keydown", (event) => { if (event.key === "Escape" && !$("#rerun-dialog").open && !$("#cancel-dialog").open) closeDrawer(); });

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
      const verdict = (a.decided_at === null ? "waiting" : a.approved ? "approved" : "rejected") + (a.decided_by ? ` by ${a.decided_by}` : "");
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

function modelWaits(run, stepId) {
  // The waits for a model endpoint's limits, as the server folded them.
  const waits = [...run.executions.values()].filter((e) => e.step === stepId).flatMap((e) => e.waits.filter((w) => w.kind === "limit").map((w) => ({ ...w, id: e.step_id })));
  if (!waits.length) return [];
  const ul = el("ul", { className: "model-waits" });
  for (const w of waits) ul.append(el("li", { textContent: `${w.id !== stepId ? `${w.id}: ` : ""}${waitText(w)}${w.ended_at ? ` — waited ${duration(w.ended_at - w.started_at)}` : " — waiting"}` }));
  return [el("h3", { textContent: `waits for the model endpoint (${waits.length})` }), ul];
}
