// The steps table (each step's latest execution, as the server folded it, with its stored
// output), and the run's error: on the failed step's row, once.

import { $, el, statusBadge, swap } from "./dom.js";
import { openDrawer } from "./drawer.js";
import { absolute, duration, forPerson, number, tokensOf } from "./format.js";
import { openRerun } from "./rerun.js";
import { ENDED_STATUSES } from "./names.js";
import { latest, rerunnable, state, stepStatus } from "./state.js";

const ENDED = new Set(ENDED_STATUSES); // an execution's statuses once it has ended

export function renderSteps(run) {
  const ids = run.data ? run.data.graph.map((n) => n.id) : [];
  for (const e of run.executions.values()) if (e.item === null && !ids.includes(e.step_id)) ids.push(e.step_id);
  const rows = ids.map((id) => {
    const status = stepStatus(run, id);
    const last = latest(run, id) || {};
    const record = run.records.get(id) || {};
    const row = el("tr");
    row.dataset.step = id;
    row.dataset.status = status;
    const open = el("button", { type: "button", textContent: id, title: "open the step" });
    open.addEventListener("click", () => openDrawer(state.run, id));
    const usage = last.usage || record.usage;
    const end = last.finished_at || (last.started_at && !ENDED.has(status) ? Date.now() / 1000 : null);
    let result;
    if (status === "failed") result = el("td", { className: "result error", textContent: forPerson(last.error || record.error) });
    else if (status === "skipped") result = el("td", { className: "result muted", textContent: forPerson(last.skipped, 120) });
    else {
      const output = record.output === undefined || record.output === null ? "" : (typeof record.output === "string" ? record.output : JSON.stringify(record.output));
      result = el("td", { className: "result", textContent: output.slice(0, 300), title: output.slice(0, 1000) });
    }
    row.append(
      el("td", {}, open),
      el("td", {}, statusBadge(status)),
      el("td", { className: "wide when", textContent: absolute(last.started_at) }),
      el("td", { className: "num", textContent: last.started_at && end ? duration(end - last.started_at) : "" }),
      el("td", { className: "num", textContent: number(tokensOf(usage)) }),
      result,
      el("td", {}, rerunnable(run, id) ? el("button", { type: "button", className: "rerun", textContent: "rerun from here", title: `a new run from step ${id}`, onclick: () => openRerun(state.run, id) }) : ""),
    );
    return row;
  });
  swap($("#steps tbody"), rows);
}

export function renderError(run) {
  const data = run.data;
  const banner = $("#run-error");
  if (!data || data.status !== "failed") { banner.hidden = true; return; }
  const failed = [...run.executions.values()].find((e) => e.status === "failed" && e.item === null);
  if (failed) {
    banner.replaceChildren(`Failed at step ${failed.step_id}.`, el("button", { type: "button", textContent: "see the step", onclick: () => openDrawer(run, failed.step) }));
  } else {
    banner.replaceChildren(forPerson(data.error, 300) || "Failed.");
  }
  banner.hidden = false;
}
