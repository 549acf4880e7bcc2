// Making and swapping the page's nodes.

export const $ = (selector) => document.querySelector(selector);

export function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

export function swap(box, nodes) {
  // Replace what a pane shows only when it changed: a node under the pointer, the focus or a
  // test is not pulled away by a redraw that shows the same.
  const next = box.cloneNode(false);
  next.append(...nodes);
  if (next.innerHTML !== box.innerHTML) box.replaceChildren(...next.childNodes);
}

export function statusBadge(status, rejectedBy) {
  // A run's outcome: its status, or `rejected` (a failed run a person rejected a call of).
  const title = status === "rejected" ? `failed: ${rejectedBy ? `${rejectedBy} rejected` : "a person rejected"} one of its calls` : "";
  return el("span", { className: `status s-${status}`, textContent: status, title });
}
