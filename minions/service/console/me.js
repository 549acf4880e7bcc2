// Who the token is (GET /me: a key's name and role, never the key) and the calls that wait
// for a decision it may make (in the project picked), in the header; the audit page's link
// for admins.

import { api, inProject } from "./api.js";
import { $ } from "./dom.js";
import { state } from "./state.js";

export async function refreshMe() {
  let me;
  const project = state.project;
  try { me = await api(inProject("/me")); } catch { return; }
  if (project !== state.project) return; // another project was picked meanwhile
  state.me = me;
  const shown = $("#me");
  shown.hidden = false;
  shown.textContent = `${me.name} · ${me.role}`;
  shown.title = `signed in as ${me.name} (${me.role}${me.projects.length ? `; projects: ${me.projects.join(", ")}` : ""}): may ${me.may.join(", ")}`;
  $("#nav-audit").hidden = !me.may.includes("admin");
  const waiting = $("#waiting");
  waiting.hidden = !me.may.includes("approve");
  waiting.textContent = me.waiting === 1 ? "1 waits for you" : `${me.waiting} wait for you`;
  waiting.classList.toggle("some", me.waiting > 0);
  waiting.title = `calls ${project ? `of project ${project} ` : ""}that wait for a decision you may make: show the waiting runs`;
}

$("#waiting").addEventListener("click", (event) => {
  // The runs that wait, in the list.
  event.preventDefault();
  $("#f-status").value = "waiting";
  $("#f-status").dispatchEvent(new Event("change"));
  location.hash = "#/";
});
