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

export function statusBadge(status) {
  return el("span", { className: `status s-${status}`, textContent: status });
}
