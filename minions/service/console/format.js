// Numbers, times, durations and texts as a person reads them.

export const tokensOf = (u) => (u && u.calls ? (u.prompt_tokens || 0) + (u.completion_tokens || 0) : null);
export const number = (n) => (n === null || n === undefined ? "" : Number(n).toLocaleString("en"));

export function absolute(t) {
  if (!t) return "";
  const d = new Date(t * 1000);
  const today = new Date().toDateString() === d.toDateString();
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return today ? time : `${d.toLocaleDateString([], { day: "numeric", month: "short", year: "numeric" })} ${time}`;
}

export function relative(t) {
  if (!t) return "";
  const s = Date.now() / 1000 - t;
  if (s < -5) return `in ${ahead(-s)}`;
  if (s < 5) return "just now";
  if (s < 60) return `${Math.floor(s)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

function ahead(s) {
  // Rounded before the unit is chosen: never "in 60 min".
  const whole = Math.ceil(s);
  if (whole < 60) return `${whole} s`;
  const minutes = Math.round(s / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.round(s / 3600);
  return hours < 24 ? `${hours} h` : `${Math.round(s / 86400)} d`;
}

export function interval(seconds) {
  // A schedule's interval as it was given: 30 s, 5 min, 2 h, 1 d.
  for (const [size, unit] of [[86400, "d"], [3600, "h"], [60, "min"]]) if (seconds >= size && seconds % size === 0) return `${seconds / size} ${unit}`;
  return `${seconds} s`;
}

const pad = (n) => String(n).padStart(2, "0");

export function duration(seconds) {
  // The console's one duration: 0.42 s, 12.3 s, 4 min 05 s, 2 h 03 min. Rounded to what is
  // shown before it is split into units, so no part reaches its unit's size (never
  // "4 min 60 s" nor "60.0 s").
  if (seconds === null || seconds === undefined || Number.isNaN(Number(seconds))) return "";
  const s = Math.max(0, Number(seconds));
  if (s < 9.995) return `${s.toFixed(2)} s`;
  if (s < 59.95) return `${s.toFixed(1)} s`;
  const whole = Math.round(s);
  if (whole < 3600) return `${Math.floor(whole / 60)} min ${pad(whole % 60)} s`;
  const minutes = Math.round(s / 60);
  return `${Math.floor(minutes / 60)} h ${pad(minutes % 60)} min`;
}

// A message meant for the model ("Answer again, more briefly.") is never shown to a person:
// an error keeps its first line, without the sentences that tell the model what to do, cut
// short. The drawer shows more of it, never the note. A sentence ends at `.`, `!` or `?`
// before a space only, so an address (http://127.0.0.1:8080/v1) or a version stays whole,
// and every other character of the line is kept; a sentence naming an address is never taken
// for a note. The caller puts the text in a node's text (never its HTML).
const TO_THE_MODEL = /^(answer|reply|respond|return|call|use|try|give|please|fix|output|write|only|make sure)\b/i;
export function forPerson(text, max = 200) {
  if (!text) return "";
  const first = String(text).trim().split("\n")[0];
  const sentences = first.split(/(?<=[.!?])\s+/);
  const kept = sentences.filter((s) => s.includes("://") || !TO_THE_MODEL.test(s));
  let out = (kept.length ? kept : sentences).join(" ").trim()
    .replace(/\byour (reply|answer|response|output)\b/gi, "the model's $1");
  if (out.length > max) out = `${out.slice(0, max - 1).trimEnd()}…`;
  return out;
}

export function clipped(value, max = 4000) {
  const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
  return text && text.length > max ? `${text.slice(0, max)}\n… (${number(text.length - max)} more characters)` : text;
}

const WAIT_REASON = {
  max_concurrent: "as many calls as allowed were in flight",
  requests_per_minute: "its requests per minute were used up",
  tokens_per_minute: "its tokens per minute were used up",
  retry_after: "it asked to wait (429, Retry-After)",
};

export function waitText({ endpoint, model, limit, delay }) {
  // What a model call waits for: its endpoint's limit (an event's `reason`, a wait's `limit`).
  return `waits for ${endpoint || model || "its model endpoint"}: ${WAIT_REASON[limit] || limit}${delay ? `, about ${duration(delay)}` : ""}`;
}
