// The console's one state: the token, the project picked, the runs list, the run on screen and what the server
// folded of its steps (the states of its event stream), the schedule shown, the drawer.

import { TERMINAL_STATUSES } from "./names.js";

const TOKEN_KEY = "minions-token";
export const TERMINAL = new Set(TERMINAL_STATUSES);
export const PAGE = Number(new URLSearchParams(location.search).get("page_size")) || 25; // runs a page

export const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  listTimer: null, // refreshes the list or the schedules every 2 s
  list: { cursors: [null], total: 0, next: null, recipes: [], refreshing: 0, typing: null }, // cursors: one per page seen
  run: null, // the run on screen (see newRun)
  schedule: null, // the schedule whose runs are shown
  fleet: null, // the fleet's view shown: workers, endpoints, queue or usage
  evalId: null, // the eval whose report is shown
  opener: null, // what had the focus when the drawer opened
  frame: null, // a render asked for the next frame
  refused: () => {}, // what to do when the token is refused (the login asks again)
  me: null, // GET /me: who the token is, what it may do, what waits for it
  projects: [], // GET /projects: the projects the token may pick
  project: null, // the one picked: every listing is narrowed to it (null: all the token's)
};

export function setToken(token) {
  state.token = token;
  if (token === null) sessionStorage.removeItem(TOKEN_KEY);
  else sessionStorage.setItem(TOKEN_KEY, token);
}

// -- the run on screen -----------------------------------------------------------------------

export function newRun(id) {
  return {
    id,
    source: null, // its EventSource
    data: null, // GET /runs/{id}
    records: new Map(), // its stored steps (with their outputs), by step id
    executions: new Map(), // what the server folded of its events: each execution, by `step#visit`
    steps: {}, // and each step's status
    folded: false, // a fold came
    lastSeq: 0,
    ended: false,
    startedAt: null,
    endedAt: null,
    marks: [], // what happened between workers (drained, handed back, taken over): {kind, at, text}
    ticker: null,
    refreshing: null,
  };
}

export function takeStates(run, states) {
  // A `states` message of the stream (or GET /runs/{id}/steps): every execution (`full`), or
  // those the last event changed.
  if (states.full) {
    run.executions = new Map();
    run.steps = {};
  }
  for (const e of states.executions) run.executions.set(`${e.step_id}#${e.visit}`, e);
  Object.assign(run.steps, states.steps);
  run.folded = true;
}

export function stepStatus(run, id) {
  return run.steps[id] || "pending";
}

export function latest(run, id) {
  // The latest execution of a step (or loop item): its highest visit.
  let found = null;
  for (const e of run.executions.values()) if (e.step_id === id && (!found || e.visit > found.visit)) found = e;
  return found;
}

export function rerunnable(run, stepId) {
  // A step a rerun may start from, as the server says (`rerun_from` of GET /runs/{id}).
  return Boolean(run.data && (run.data.rerun_from || []).includes(stepId));
}
