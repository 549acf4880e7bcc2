// Who the token is (GET /me: a key's name and role, never the key) and the calls that wait
// for a decision it may make, in the header; the audit page's link for admins.

import { api } from "./api.js";
import { $ } from "./dom.js";
import { state } from "./state.js";

export async function refreshMe() {
  let me;
  try { me = await api("/me"); } catch { return; }
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
  waiting.title = "calls that wait for a decision you may make: show the waiting runs";
}

$("#waiting").addEventListener("click", (event) => {
  // The runs that wait, in the list.
  event.preventDefault();
  $("#f-status").value = "waiting";
  $("#f-status").dispatchEvent(new Event("change"));
  location.hash = "#/";
});
