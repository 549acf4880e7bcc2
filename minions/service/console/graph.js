// The recipe's steps as a graph, each node coloured by its step's status (the server's fold).

import { $, swap } from "./dom.js";
import { openDrawer } from "./drawer.js";
import { state, stepStatus } from "./state.js";

export function renderGraph(run) {
  const nodes = run.data ? run.data.graph : [];
  const level = {};
  const depth = (id, seen = new Set()) => {
    if (level[id] !== undefined) return level[id];
    if (seen.has(id)) return 0;
    seen.add(id);
    const node = nodes.find((n) => n.id === id);
    const parents = [...(node ? node.depends_on : []), ...nodes.filter((n) => n.next.includes(id) && !seen.has(n.id)).map((n) => n.id)];
    level[id] = parents.length ? Math.max(...parents.map((p) => depth(p, seen) + 1)) : 0;
    return level[id];
  };
  nodes.forEach((n) => depth(n.id));
  const columns = {};
  nodes.forEach((n) => { (columns[level[n.id]] = columns[level[n.id]] || []).push(n.id); });
  const W = 140, H = 34, GX = 46, GY = 14;
  const place = {};
  Object.entries(columns).forEach(([col, ids]) => ids.forEach((id, row) => { place[id] = { x: 10 + col * (W + GX), y: 10 + row * (H + GY) }; }));
  const ns = "http://www.w3.org/2000/svg";
  const svg = $("#graph");
  const make = (tag, attrs) => { const n = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v); return n; };
  const defs = make("defs", {});
  const marker = make("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" });
  marker.append(make("path", { d: "M 0 0 L 10 5 L 0 10 z" }));
  defs.append(marker);
  const parts = [defs];
  const edge = (a, b) => {
    const back = b.x <= a.x; // a transition back to an earlier step: around, below
    const d = back
      ? `M ${a.x + W / 2} ${a.y + H} C ${a.x + W / 2} ${a.y + H + 30}, ${b.x + W / 2} ${b.y + H + 30}, ${b.x + W / 2} ${b.y + H + 1}`
      : `M ${a.x + W} ${a.y + H / 2} C ${a.x + W + GX / 2} ${a.y + H / 2}, ${b.x - GX / 2} ${b.y + H / 2}, ${b.x - 1} ${b.y + H / 2}`;
    return make("path", { d, "marker-end": "url(#arrow)" });
  };
  for (const n of nodes) {
    for (const target of n.next) if (place[target]) parts.push(edge(place[n.id], place[target]));
    for (const source of n.depends_on) if (place[source] && !nodes.find((m) => m.id === source).next.includes(n.id)) parts.push(edge(place[source], place[n.id]));
  }
  for (const n of nodes) {
    const status = stepStatus(run, n.id);
    const g = make("g", { class: `node n-${status}`, tabindex: "0", role: "button", "aria-label": `${n.kind} step ${n.id}: ${status}; open it` });
    g.dataset.step = n.id;
    g.dataset.status = status;
    const label = n.id.length > 16 ? `${n.id.slice(0, 15)}…` : n.id;
    g.append(make("rect", { x: place[n.id].x, y: place[n.id].y, width: W, height: H }));
    const text = make("text", { x: place[n.id].x + 8, y: place[n.id].y + H / 2 + 4 });
    text.textContent = `${label} · ${status}`;
    const title = make("title", {});
    title.textContent = `${n.kind} step ${n.id}: ${status}`;
    g.append(text, title);
    g.addEventListener("click", () => openDrawer(state.run, n.id));
    g.addEventListener("keydown", (event) => { if (event.key === "Enter" || event.key === " ") { event.preventDefault(); openDrawer(state.run, n.id); } });
    parts.push(g);
  }
  const cols = Object.keys(columns).length, rows = Math.max(1, ...Object.values(columns).map((c) => c.length));
  const width = Math.max(1, cols) * (W + GX) + 20, height = rows * (H + GY) + 40;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  swap(svg, parts);
}
