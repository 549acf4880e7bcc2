// The API, with the token in a header.

import { state } from "./state.js";

export class ApiError extends Error {
  constructor(status, type, message) { super(message); this.status = status; this.type = type; }
}

export async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${state.token}`, ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) { state.refused("the token was refused"); throw new ApiError(401, "unauthorized", "the token was refused"); }
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = (body && body.error) || { type: "error", message: response.statusText };
    throw new ApiError(response.status, error.type, error.message);
  }
  return body;
}

export function inProject(path) {
  // A listing narrowed to the project picked (the server checks that it is the token's).
  if (!state.project) return path;
  return `${path}${path.includes("?") ? "&" : "?"}project=${encodeURIComponent(state.project)}`;
}
