// The project picker in the header: the projects the token may pick (GET /projects: a key's
// own; an admin's, every one the store knows) and "all projects". The one picked narrows every
// listing (runs, schedules, evals, workers' runs, queue, usage, audit, the waiting count)
// through the server's own `?project=`, and is remembered in this browser (localStorage).
// A token of one project sees its name, and no picker.

import { $, el } from "./dom.js";
import { api } from "./api.js";
import { state } from "./state.js";

const KEY = "minions-project";
let changed = () => {};

export function onProjectChange(callback) { changed = callback; }

export async function loadProjects() {
  let projects = [];
  try { projects = await api("/projects"); } catch { /* an older server: no picker */ }
  state.projects = projects;
  const several = projects.length > 1;
  const kept = localStorage.getItem(KEY);
  state.project = several && projects.includes(kept) ? kept : null;
  document.body.classList.toggle("several-projects", several);
  $("#picker").hidden = !several;
  $("#project").replaceChildren(el("option", { value: "", textContent: "all projects" }), ...projects.map((p) => el("option", { value: p, textContent: p })));
  $("#project").value = state.project || "";
  const one = $("#project-name");
  one.hidden = projects.length !== 1;
  one.textContent = projects.length === 1 ? projects[0] : "";
  one.title = projects.length === 1 ? `every run, schedule and eval you see is of project ${projects[0]}` : "";
}

export function forgetProjects() {
  state.projects = [];
  state.project = null;
  $("#picker").hidden = true;
  $("#project-name").hidden = true;
  document.body.classList.remove("several-projects");
}

$("#project").addEventListener("change", () => {
  state.project = $("#project").value || null;
  if (state.project) localStorage.setItem(KEY, state.project);
  else localStorage.removeItem(KEY);
  changed();
});
