// A run's events as they come (Server-Sent Events, through an EventSource opened with a stream
// ticket: the token stays in headers), with the states of its steps the server folds from them
// (`?states=true`): the events list, the streaming text, and what the page draws.

import { api } from "./api.js";
import { $, el } from "./dom.js";
import { absolute, duration, forPerson, number, tokensOf, waitText } from "./format.js";
import { EVENT_KINDS, TERMINAL_KINDS } from "./names.js";
import { TERMINAL, state, takeStates } from "./state.js";

// The events after which the run is read again (GET /runs/{id}): its record changed.
const REFRESH_ON = new Set(["step_reused", "rerun_planned", "step_completed", "step_failed", "step_skipped", "approval_requested", "approval_resolved", ...TERMINAL_KINDS, "run_started", "run_handed_back", "run_taken_over", "run_requeued"]);
const ENDS = new Set(TERMINAL_KINDS); // the events that end a run's log
// What happened to the run between workers: marks on its timeline.
const HANDOFFS = {
  run_draining: (e) => `worker ${e.executor_id} stopping: ${e.in_flight.length ? `${e.in_flight.join(", ")} may finish within ${duration(e.grace)}` : "no step in flight"}`,
  run_handed_back: (e) => `handed back by worker ${e.executor_id} (${e.reason === "drain" ? "it stopped" : "no place there, one elsewhere"}), queued again in its place as attempt ${e.attempt}${e.cut_short.length ? `; cut short: ${e.cut_short.join(", ")}` : ""}`,
  run_taken_over: (e) => `taken over by worker ${e.by} from ${e.executor_id || "a worker"} that stopped beating; queued again in its place as attempt ${e.attempt}`,
  run_requeued: (e) => `queued again as attempt ${e.attempt}: ${e.reason}`,
  run_resumed: (e) => `resumed${e.actor ? ` by ${e.actor}` : ""} as attempt ${e.attempt}`,
};

export async function follow(run, page) {
  // An EventSource on a stream ticket: EventSource cannot send the token, so a short-lived
  // ticket for this run's stream goes in its URL instead (never the token). It resumes by
  // itself after a dropped connection (Last-Event-ID); after the run's terminal event the
  // server closes the stream and the source is closed here, before it would come back
  // (coming back, it would get a 204, which stops it too). `page` redraws the run (`render`)
  // or reads it again first (`refresh`).
  if (state.run !== run || run.ended) return;
  let ticket;
  try { ticket = await api(`/runs/${run.id}/events/ticket`, { method: "POST" }); }
  catch (error) {
    $("#event-count").textContent = `stream: ${error.message}`;
    if (error.status !== 401) await folded(run, page); // what the stream would have brought
    return;
  }
  if (state.run !== run) return;
  const after = run.lastSeq ? `&after=${run.lastSeq}` : "";
  const source = new EventSource(`/runs/${run.id}/events/stream?ticket=${encodeURIComponent(ticket.ticket)}&states=true${after}`);
  run.source = source;
  let last = null;
  const receive = (message) => {
    const event = JSON.parse(message.data);
    if (event.kind !== "token_delta") last = event.kind;
    onEvent(run, event, page);
  };
  for (const kind of EVENT_KINDS) source.addEventListener(kind, receive);
  source.addEventListener("states", (message) => {
    if (state.run !== run) return;
    takeStates(run, JSON.parse(message.data));
    scheduleRender(run, page);
  });
  source.onerror = async () => {
    if (state.run !== run || run.source !== source) { source.close(); return; }
    const ended = ENDS.has(last);
    if (source.readyState !== EventSource.CLOSED && !ended) return; // it comes back by itself
    source.close(); // the run's end (or a refused ticket): do not come back
    run.source = null;
    let data;
    try { data = await api(`/runs/${run.id}`); } catch { return; }
    if (TERMINAL.has(data.status)) { run.ended = true; await folded(run, page); await page.refresh(run); return; }
    if (!ended) await new Promise((resolve) => setTimeout(resolve, 1000)); // a refused ticket
    follow(run, page); // a run resumed after failing goes on: follow it from where it was
  };
}

async function folded(run, page) {
  // The states of the run's steps when no stream brought them (it had ended with no event to
  // send, or could not open).
  if (run.folded) return;
  let states;
  try { states = await api(`/runs/${encodeURIComponent(run.id)}/steps`); } catch { return; }
  if (state.run !== run || run.folded) return;
  takeStates(run, states);
  page.render(run);
}

function onEvent(run, event, page) {
  if (state.run !== run) return;
  if (event.kind === "token_delta") {
    const key = `${event.step_id}`;
    let box = document.querySelector(`#tokens pre[data-step="${CSS.escape(key)}"]`);
    if (!box) {
      const hint = $("#tokens p");
      if (hint) hint.remove();
      box = el("pre");
      box.dataset.step = key;
      $("#tokens").append(el("h4", { textContent: `step ${key}` }), box);
    }
    if (box.dataset.attempt !== String(event.attempt)) { box.textContent = ""; box.dataset.attempt = String(event.attempt); }
    box.textContent += event.text;
    box.scrollTop = box.scrollHeight;
    return;
  }
  if (event.seq <= run.lastSeq) return;
  run.lastSeq = event.seq;
  if (event.kind === "run_started" && !run.startedAt) run.startedAt = event.timestamp;
  if (ENDS.has(event.kind) && !run.endedAt) run.endedAt = event.timestamp;
  if (HANDOFFS[event.kind]) run.marks.push({ kind: event.kind, at: event.timestamp, text: HANDOFFS[event.kind](event) });
  const item = el("li");
  item.dataset.kind = event.kind;
  const detail = event.kind === "model_call_waiting" ? waitText({ ...event, limit: event.reason })
    : event.kind === "step_reused" ? `from run ${String(event.source_run_id).slice(0, 12)}${event.edited ? " (its output set by hand)" : ""}`
    : event.kind === "rerun_planned" ? `of run ${String(event.parent_run_id).slice(0, 12)} from step ${event.from_step}`
    : event.kind === "step_cached" ? `from the cache (made ${duration(event.age)} ago${tokensOf(event.saved) ? `, saved ${number(tokensOf(event.saved))} tokens` : ""})`
    : HANDOFFS[event.kind] ? HANDOFFS[event.kind](event)
    : event.error || event.reason || event.name || event.tool || "";
  const since = run.startedAt ? `+${duration(event.timestamp - run.startedAt)}` : "";
  item.append(el("span", { className: "seq", textContent: String(event.seq) }), el("span", { className: "at", textContent: since, title: absolute(event.timestamp) }),
    `${event.kind}${event.step_id ? ` ${event.step_id}` : ""}${detail ? ` ${forPerson(detail, 160)}` : ""}`);
  const box = $("#events");
  const atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  box.append(item);
  if (atEnd) box.scrollTop = box.scrollHeight;
  $("#event-count").textContent = `(${run.lastSeq})`;
  if (REFRESH_ON.has(event.kind)) scheduleRefresh(run, page);
}

function scheduleRefresh(run, page) {
  // A finished run's events come all at once: read the run once for them.
  if (run.refreshing) return;
  run.refreshing = setTimeout(async () => { run.refreshing = null; await page.refresh(run); }, 100);
}

function scheduleRender(run, page) {
  // Many states come at once (a finished run's events, replayed): draw once per frame.
  if (state.frame) return;
  state.frame = requestAnimationFrame(() => { state.frame = null; if (state.run === run) page.render(run); });
}
