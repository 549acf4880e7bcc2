// The run's timeline: each execution the server folded (a step's visit, or a loop item) a bar
// from its start to its end; its waits (for a person, for a model endpoint's limit) and
// retries marked; above them, when the run moved between workers, a row of marks (a worker
// draining, a hand-back, a takeover, a requeue).

import { $, el, swap } from "./dom.js";
import { openDrawer } from "./drawer.js";
import { absolute, duration, forPerson, number, tokensOf, waitText } from "./format.js";
import { TERMINAL, state } from "./state.js";

export function renderTimeline(run) {
  const rows = [...run.executions.values()];
  const starts = rows.map((r) => r.started_at).filter(Boolean);
  const t0 = Math.min(...[run.startedAt, ...starts].filter(Boolean));
  const live = run.data && !TERMINAL.has(run.data.status);
  const ends = rows.map((r) => r.finished_at).filter(Boolean);
  const marks = run.marks || [];
  const t1 = Math.max(live ? Date.now() / 1000 : 0, run.endedAt || 0, ...ends, ...starts, ...marks.map((m) => m.at), t0 + 0.001);
  const box = $("#timeline");
  if (!Number.isFinite(t0) || !rows.length) {
    swap(box, [el("p", { className: "muted small", textContent: "No step has started yet." })]);
    $("#timeline-span").textContent = "";
    return;
  }
  const span = t1 - t0;
  const at = (t) => `${Math.min(100, Math.max(0, ((t - t0) / span) * 100)).toFixed(3)}%`;
  $("#timeline-span").textContent = `${duration(span)} from ${absolute(t0)}`;
  const axis = el("div", { className: "tl-axis" }, el("span", { textContent: "step" }));
  const ticks = el("div", { className: "tl-ticks" });
  for (let i = 0; i <= 4; i += 1) ticks.append(el("span", { textContent: i === 0 ? "0" : `+${duration((span * i) / 4)}`, style: `left:${i * 25}%` }));
  axis.append(ticks);
  // Steps in the order they started (loop items under their step), then the rest.
  const order = (r) => (r.started_at === null ? Infinity : r.started_at);
  const item = (r) => r.item !== null;
  const parents = rows.filter((r) => !item(r)).sort((a, b) => order(a) - order(b));
  const ordered = [];
  for (const parent of parents) {
    ordered.push(parent);
    ordered.push(...rows.filter((r) => item(r) && r.step === parent.step && r.visit === parent.visit).sort((a, b) => order(a) - order(b)));
  }
  ordered.push(...rows.filter((r) => item(r) && !ordered.includes(r)));
  const lines = ordered.map((r) => {
    const line = el("div", { className: `tl-row${item(r) ? " item" : ""}` });
    line.dataset.step = r.step_id;
    line.dataset.status = r.status;
    const visits = rows.filter((o) => o.step_id === r.step_id).length;
    const label = el("button", { type: "button", className: "tl-label", textContent: visits > 1 ? `${r.step_id} (${r.visit})` : r.step_id, title: `${r.step_id}: ${r.status} — open the step` });
    label.addEventListener("click", () => openDrawer(state.run, r.step));
    const track = el("div", { className: "tl-track" });
    if (r.started_at) {
      const end = r.finished_at || (live ? Date.now() / 1000 : t1);
      const tokens = tokensOf(r.usage);
      const bar = el("div", { className: `tl-bar s-${r.status}`, title: r.status === "reused" ? `${r.step_id}: reused from the parent run, no call` : `${r.step_id}: ${r.status}, ${duration(end - r.started_at)}${tokens ? `, ${number(tokens)} tokens` : ""}` });
      bar.style.left = at(r.started_at);
      bar.style.width = `calc(${at(end)} - ${at(r.started_at)})`;
      track.append(bar);
    } else if (r.status === "skipped") {
      track.append(el("span", { className: "tl-skip", textContent: `skipped${r.skipped ? `: ${forPerson(r.skipped, 80)}` : ""}` }));
    }
    for (const w of r.waits) {
      const limit = w.kind === "limit";
      const how = limit ? `${waitText(w)}; waited` : "waited for a person";
      const wait = el("div", { className: `tl-wait${limit ? " model" : ""}`, title: `${how} ${duration((w.ended_at || Date.now() / 1000) - w.started_at)}` });
      wait.style.left = at(w.started_at);
      wait.style.width = `calc(${at(w.ended_at || (live ? Date.now() / 1000 : t1))} - ${at(w.started_at)})`;
      track.append(wait);
    }
    for (const retry of r.retries) {
      const mark = el("span", { className: "tl-retry", title: `retry (${retry.target}, attempt ${retry.attempt} failed): ${forPerson(retry.reason, 160)}` });
      mark.style.left = at(retry.at);
      track.append(mark);
    }
    line.append(label, track);
    return line;
  });
  if (marks.length) {
    const track = el("div", { className: "tl-track" });
    for (const m of marks) {
      const mark = el("span", { className: `tl-handoff k-${m.kind}`, title: `${absolute(m.at)}: ${m.text}` });
      mark.style.left = at(m.at);
      track.append(mark);
    }
    const row = el("div", { className: "tl-row tl-run" }, el("span", { className: "tl-label muted", textContent: "workers", title: "the run between workers: drained, handed back, taken over, queued again" }), track);
    lines.unshift(row);
  }
  swap(box, [axis, ...lines]);
}
