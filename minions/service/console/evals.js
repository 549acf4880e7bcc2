// The evals run on the store's workers (`minions eval --durable`) and their kept reports:
// each case's pass rate, flaky and regressed marks; each case run opens its run page; a
// regressed case opens the diff of its failed run against the baseline's run of the case.

import { api, inProject } from "./api.js";
import { $, el, swap } from "./dom.js";
import { duration, forPerson, number } from "./format.js";
import { timeCell } from "./list.js";
import { state } from "./state.js";

const rate = (value) => (value === null || value === undefined ? "—" : value.toFixed(2));

export function showEvals(evalId) {
  state.evalId = evalId;
  $("#evals-list").hidden = !!evalId;
  $("#eval-detail").hidden = !evalId;
  if (evalId) {
    $("#eval-cases tbody").replaceChildren();
    $("#eval-head").replaceChildren();
  }
  refreshEvals();
}

export async function refreshEvals() {
  if (state.evalId) return refreshEval(state.evalId);
  let page;
  const project = state.project;
  try { page = await api(inProject("/evals?limit=100")); } catch (error) { $("#evals-error").textContent = error.message; return; }
  if (project !== state.project) return; // another project was picked meanwhile
  $("#evals-error").textContent = "";
  const rows = page.evals.map((e) => {
    const s = e.summary || {};
    const row = el("tr");
    row.dataset.eval = e.eval_id;
    row.dataset.status = e.status;
    const interval = s.interval ? ` (${rate(s.interval[0])}–${rate(s.interval[1])})` : "";
    const marks = [];
    if (s.flaky) marks.push(el("span", { className: "mark flaky", textContent: `${s.flaky} flaky` }));
    if (s.regressed) marks.push(el("span", { className: "mark regressed", textContent: `${s.regressed} regressed` }));
    const verdict = e.status !== "finished" ? el("span", { className: "status s-running", textContent: "running" })
      : el("span", { className: `status ${s.ok ? "s-completed" : "s-failed"}`, textContent: s.ok ? "passed" : "failed" });
    row.append(
      el("td", {}, el("a", { href: `#/evals/${encodeURIComponent(e.eval_id)}`, className: "mono", textContent: e.eval_id }), el("div", { className: "proj proj-tag", textContent: e.project })),
      el("td", { textContent: e.dataset }),
      el("td", { className: "wide", textContent: e.target }),
      el("td", {}, verdict),
      timeCell(e.created_at),
      el("td", { className: "num", textContent: e.status === "finished" ? `${rate(s.pass_rate)}${interval}` : "" }),
      el("td", { className: "num", textContent: e.status === "finished" ? `${number(s.passed)} of ${number(s.runs)}` : `${number(e.total)} case runs` }),
      el("td", {}, ...marks),
    );
    return row;
  });
  if (!rows.length) rows.push(el("tr", { className: "empty" }, el("td", { colSpan: 8, textContent: "No evals kept. Run one on the workers with `minions eval DATASET.yaml --durable`." })));
  swap($("#evals tbody"), rows);
}

async function refreshEval(evalId) {
  let detail;
  try { detail = await api(`/evals/${encodeURIComponent(evalId)}`); }
  catch (error) { $("#eval-head").replaceChildren(el("p", { className: "error", textContent: error.message })); return; }
  if (state.evalId !== evalId) return;
  const report = detail.report;
  const head = [el("h2", {}, "eval ", el("code", { id: "eval-id", textContent: detail.eval_id }), " ", el("span", { className: "muted", textContent: `${detail.dataset} on ${detail.target}` }))];
  if (!report) {
    head.push(el("p", { className: "muted", textContent: `Running: ${number(detail.total)} case runs on the workers; the report comes when the last one is graded.` }));
    swap($("#eval-head"), head);
    $("#eval-cases tbody").replaceChildren();
    return;
  }
  const interval = report.interval ? ` (95% CI ${rate(report.interval[0])}–${rate(report.interval[1])})` : "";
  head.push(el("p", { id: "eval-summary" }, el("strong", { textContent: `pass rate ${rate(report.pass_rate)}${interval}` }),
    ` over ${number(report.passed + report.failed)} graded runs of ${report.cases.length} cases; ${report.errors} errors; ${number(report.usage.total_tokens)} tokens; ${duration(report.duration)}`));
  if (report.comparison) {
    const c = report.comparison;
    head.push(el("p", { className: "muted", textContent: `against ${c.baseline}: ${c.regressed.length} regressed, ${c.improved.length} improved, ${c.unchanged.length} unchanged; ${c.beyond_noise ? "beyond noise" : "within noise"} (sign test p = ${c.p_value.toFixed(3)})` }));
  }
  if (report.note) head.push(el("p", { className: "error", textContent: report.note }));
  head.push(el("ul", { id: "eval-gates" }, ...report.gates.map((g) => el("li", { className: g.ok ? "ok" : "error", textContent: `gate ${g.gate}: ${g.ok ? "ok" : "FAILED"} (${g.reason})` }))));
  swap($("#eval-head"), head);
  const several = new Set(report.cases.map((c) => c.target)).size > 1;
  const diffable = new Set(detail.diffable);
  const rows = report.cases.map((c) => {
    const row = el("tr");
    row.dataset.case = several ? `${c.target}/${c.id}` : c.id;
    if (c.baseline) row.dataset.baseline = c.baseline;
    const bar = el("span", { className: "rate-bar", title: `${c.passed} passed, ${c.failed} failed, ${c.errors} errors` },
      el("i", { className: "passed", style: `width:${c.runs ? (100 * c.passed) / c.runs : 0}%` }),
      el("i", { className: "failed", style: `width:${c.runs ? (100 * c.failed) / c.runs : 0}%` }));
    const marks = el("td", { className: "marks" });
    if (c.flaky) marks.append(el("span", { className: "mark flaky", textContent: "flaky" }));
    if (c.baseline === "regressed") {
      marks.append(el("span", { className: "mark regressed", textContent: `regressed ${rate(c.baseline_pass_rate)} → ${rate(c.pass_rate)}` }));
      const failed = (c.results.find((r) => r.outcome === "failed") || c.results[0] || {}).run_id;
      if (failed && c.baseline_run_id && diffable.has(c.baseline_run_id)) {
        marks.append(" ", el("a", { className: "diff", href: `#/runs/${encodeURIComponent(failed)}/diff/${encodeURIComponent(c.baseline_run_id)}`, textContent: "diff with the baseline's run" }));
      }
    } else if (c.baseline === "improved") {
      marks.append(el("span", { className: "mark improved", textContent: `improved ${rate(c.baseline_pass_rate)} → ${rate(c.pass_rate)}` }));
    }
    const runs = el("td", {}, el("div", { className: "case-runs" }, ...c.results.map((r) => el("a", {
      href: `#/runs/${encodeURIComponent(r.run_id)}`, className: `run-chip o-${r.outcome}`,
      textContent: `#${r.repetition}`, title: `run ${r.run_id}: ${r.outcome}${r.reason ? ` — ${forPerson(r.reason, 300)}` : ""}`,
    }))));
    const first = c.failures[0];
    row.append(
      el("td", { className: "mono", textContent: several ? `${c.target}/${c.id}` : c.id }),
      el("td", { className: "num" }, `${rate(c.pass_rate)} `, bar),
      el("td", { className: "num", textContent: `${c.passed}/${c.runs}` }),
      el("td", { className: "num wide", textContent: rate(c.pass_at_k) }),
      marks,
      runs,
      el("td", { className: "wide reason", textContent: first ? `${first.check}: ${forPerson(first.reason, 160)}` : "" }),
    );
    return row;
  });
  swap($("#eval-cases tbody"), rows);
  $("#eval-k").textContent = `pass@${report.k}`;
}
