// Taskplat dashboard: one static page, vanilla JS, no build step. It calls the dispatcher's public
// API with the API key the person enters, kept in sessionStorage only (gone when the tab closes).
// Every value from the API is inserted as text (textContent), never as HTML. Views refresh on
// their own every few seconds (the Live switch pauses them); a refresh that changes nothing
// leaves the page alone, and one that does keeps the scroll position. Action buttons show only
// when the key's scopes (the X-Taskplat-Scopes header of every answer) allow the action, and a
// refused action shows the API's message. The Audit page shows for admin keys only and does not
// refresh on its own (reading the audit log is an audited call).
"use strict";

const KEY = "taskplat.apiKey";
const LIVE = "taskplat.live";
const REFRESH_MS = 5000;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
let scopes = null; // the key's scopes, from the X-Taskplat-Scopes header
let refreshing = null; // the hash a quiet (live) refresh is rendering
let routing = false;
const STATES = ["Scheduled", "Queued", "Running", "Failed", "Completed", "Dead", "Canceled"];
const main = document.getElementById("main");

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}` };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const granted = response.headers.get("X-Taskplat-Scopes");
  if (granted !== null) {
    scopes = new Set(granted.split(",").filter(Boolean));
    // The audit log is for admin keys (it names every key and its scopes).
    document.querySelector("nav a[href='#/audit']").hidden = !can("admin");
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = { message: text }; }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

// Handlers live on the element (`_on`), so a live refresh that keeps an element can swap them.
function on(el, type, handler) {
  el._on = el._on || {};
  if (!(type in el._on)) el.addEventListener(type, (event) => el._on[type] && el._on[type](event));
  el._on[type] = handler;
}

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) on(el, name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) el.setAttribute(name, value);
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function can(scope) { return scopes !== null && scopes.has(scope); }

function render(...nodes) {
  if (refreshing !== null && refreshing !== location.hash) return; // the person moved on
  const fresh = document.createElement("div");
  fresh.append(...nodes.flat().filter((n) => n !== null && n !== undefined && n !== false));
  if (fresh.innerHTML === main.innerHTML) return; // nothing changed: no repaint at all
  if (refreshing === null) return main.replaceChildren(...fresh.childNodes); // a page opened
  const x = window.scrollX, y = window.scrollY;
  morphChildren(main, fresh); // a live refresh: elements stay, only what changed is written
  window.scrollTo(x, y);
}

// Makes `old`'s subtree equal to `fresh`'s, keeping every element whose place and tag match.
function morph(old, fresh) {
  for (const { name } of [...old.attributes]) if (!fresh.hasAttribute(name)) old.removeAttribute(name);
  for (const { name, value } of [...fresh.attributes]) {
    if (old.getAttribute(name) !== value) old.setAttribute(name, value);
  }
  for (const type of Object.keys(old._on || {})) old._on[type] = null;
  for (const [type, handler] of Object.entries(fresh._on || {})) on(old, type, handler);
  morphChildren(old, fresh);
}

function morphChildren(old, fresh) {
  const before = [...old.childNodes], after = [...fresh.childNodes];
  after.forEach((node, i) => {
    const kept = before[i];
    if (!kept) old.append(node);
    else if (kept.nodeName !== node.nodeName) old.replaceChild(node, kept);
    else if (kept.nodeType === Node.ELEMENT_NODE) morph(kept, node);
    else if (kept.nodeValue !== node.nodeValue) kept.nodeValue = node.nodeValue;
  });
  for (const extra of before.slice(after.length)) extra.remove();
}
function status(value) { return h("span", { class: `status ${value}` }, value); }
function when(value) { return value ? new Date(value).toLocaleString() : ""; }
function ago(value) {
  if (!value) return "";
  const seconds = (Date.now() - new Date(value).getTime()) / 1000;
  const text = seconds < 0 ? `in ${age(-seconds)}` : seconds < 5 ? "just now" : `${age(seconds)} ago`;
  return h("time", { datetime: value, title: when(value) }, text);
}
function runTime(t) {
  if (!t.started_at) return "";
  const end = t.finished_at ? new Date(t.finished_at).getTime() : Date.now();
  const seconds = Math.max(0, (end - new Date(t.started_at).getTime()) / 1000);
  return seconds < 10 ? `${seconds.toFixed(1)} s` : age(seconds);
}
function age(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}
function toast(text, isError) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.className = isError ? "error" : "";
  el.setAttribute("role", isError ? "alert" : "status");
  el.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { el.hidden = true; }, isError ? 10000 : 3000);
}
// An action's handler: a refusal (409, 403, 401...) is shown to the person, never swallowed.
function act(fn) {
  return async (event) => {
    try { await fn(event); } catch (error) {
      if (error instanceof ApiError && error.status === 401) {
        sessionStorage.removeItem(KEY);
        return loginView("The API key was refused; log in again.");
      }
      const status = error instanceof ApiError ? `${error.status} ` : "";
      toast(`Failed: ${status}${error.message}`, true);
    }
  };
}
async function copyText(text) {
  try { await navigator.clipboard.writeText(text); toast("Copied"); }
  catch (_) { toast(`Copy failed; the id is ${text}`, true); }
}
function table(columns, rows, empty) {
  if (!rows.length) return h("div", { class: "empty" }, empty || "Nothing here.");
  return h("table", {},
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))),
    h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c) => h("td", {}, c))))));
}
function taskLink(id) {
  return h("span", { class: "id" },
    h("a", { class: "mono", href: `#/task/${id}`, title: id }, id.slice(0, 8)),
    h("button", { class: "copy", type: "button", title: "Copy the full id",
                  dataset: { copy: id }, onclick: () => copyText(id) }, "copy"));
}
function unavailable(what, error) {
  if (error instanceof ApiError && (error.status === 404 || error.status === 405)) {
    return h("div", { class: "empty", id: "unavailable" },
      `${what} are not available on this dispatcher yet.`);
  }
  throw error;
}

// ---- login ---------------------------------------------------------------------------------

function loginView(message) {
  document.getElementById("nav").hidden = true;
  const input = h("input", { type: "password", id: "api-key", autocomplete: "off",
                             placeholder: "API key", required: true });
  const form = h("form", { class: "login", id: "login",
    onsubmit: async (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY, input.value.trim());
      try {
        await api("GET", "/queues");
        location.hash = "#/";
        route();
      } catch (error) {
        sessionStorage.removeItem(KEY);
        loginView(error.status === 401 ? "That API key was refused."
          : error.status === 403 ? "This key lacks the read scope the dashboard needs."
          : error.message);
      }
    } },
    h("h1", {}, "Log in"),
    h("label", {}, "API key", input),
    message ? h("div", { class: "error", id: "login-error" }, message) : null,
    h("button", { class: "primary", type: "submit" }, "Log in"),
    h("div", { class: "muted" }, "The key stays in this browser tab only."));
  render(form);
  input.focus();
}

// ---- overview ------------------------------------------------------------------------------

async function overviewView() {
  const [stats, queues, fleet] = await Promise.all([api("GET", "/stats"), api("GET", "/queues"),
    api("GET", "/workers")]);
  const byState = Object.fromEntries(STATES.map((s) => [s, 0]));
  const byQueue = {};
  for (const row of stats.counts) {
    byState[row.status] += row.tasks;
    (byQueue[row.queue] = byQueue[row.queue] || {})[row.status] = row.tasks;
  }
  const cards = h("div", { class: "cards" }, STATES.map((s) =>
    h("div", { class: "card", dataset: { state: s } },
      h("div", { class: "n" }, byState[s]),
      h("div", { class: "l" }, ["Completed", "Dead", "Canceled"].includes(s) ? `${s} (1 h)` : s))),
    h("a", { class: "card", id: "workers-card", href: "#/workers" },
      h("div", { class: "n" }, fleet.workers.filter((w) => w.state === "alive").length),
      h("div", { class: "l" }, "Workers alive")));
  const queueRows = Object.keys(byQueue).sort().map((q) =>
    [q, ...STATES.map((s) => byQueue[q][s] || 0)]);
  render(
    h("h1", {}, "Overview"), cards,
    h("h2", {}, "Throughput, last hour (tasks finished per minute)"), throughputChart(stats),
    h("h2", {}, "Tasks by queue and state"),
    table(["Queue", ...STATES], queueRows, "No tasks yet."),
    h("h2", {}, "Queues"),
    table(["Queue", "Depth", "Running", "Oldest queued", "State"], queues.queues.map((q) => [
      q.name, q.depth, q.running, age(q.oldest_queued_age_seconds),
      q.paused ? status("paused") : "running"])));
}

function throughputChart(stats) {
  const width = 720, height = 120, end = new Date(stats.generated_at).getTime();
  const buckets = new Map(stats.throughput.map((b) => [new Date(b.minute).getTime(), b]));
  const start = Math.floor(end / 60000) * 60000 - 59 * 60000;
  const max = Math.max(1, ...stats.throughput.map((b) => b.completed + b.dead));
  const bars = [];
  for (let i = 0; i < 60; i++) {
    const b = buckets.get(start + i * 60000) || { completed: 0, dead: 0 };
    const x = i * (width / 60), w = width / 60 - 2;
    const hc = (b.completed / max) * (height - 20), hd = (b.dead / max) * (height - 20);
    bars.push(svg("rect", { x, y: height - 14 - hc, width: w, height: hc, fill: "#1f8a4c" },
      svg("title", {}, `${b.completed} completed`)));
    bars.push(svg("rect", { x, y: height - 14 - hc - hd, width: w, height: hd, fill: "#c0392b" },
      svg("title", {}, `${b.dead} dead`)));
  }
  const total = stats.throughput.reduce((n, b) => n + b.completed, 0);
  return h("div", { id: "throughput" }, svg("svg", { width, height, role: "img" }, bars,
    svg("text", { x: 0, y: height - 2 }, "−60 min"),
    svg("text", { x: width - 30, y: height - 2 }, "now")),
    h("div", { class: "muted" }, `${total} completed in the last hour`));
}

// ---- tasks ---------------------------------------------------------------------------------

async function tasksView(params, title, fixedStatus) {
  const filters = { status: fixedStatus || params.get("status") || "",
                    queue: params.get("queue") || "", operator: params.get("operator") || "",
                    since: params.get("since") || "", until: params.get("until") || "" };
  const cursor = params.get("cursor") || "";
  const query = new URLSearchParams({ limit: "25" });
  for (const [k, v] of Object.entries(filters)) if (v) query.set(k, v);
  if (cursor) query.set("cursor", cursor);
  const page = await api("GET", `/tasks?${query}`);
  const base = fixedStatus ? "#/dead" : "#/tasks";
  const go = (extra) => {
    const next = new URLSearchParams();
    for (const [k, v] of Object.entries({ ...filters, ...extra })) {
      if (v && !(fixedStatus && k === "status")) next.set(k, v);
    }
    location.hash = `${base}?${next}`;
  };
  const statusSelect = h("select", { name: "status" }, h("option", { value: "" }, "any"),
    STATES.map((s) => h("option", { value: s, selected: s === filters.status }, s)));
  const queueInput = h("input", { name: "queue", value: filters.queue, size: 12 });
  const operatorInput = h("input", { name: "operator", value: filters.operator, size: 12 });
  const sinceInput = h("input", { name: "since", type: "datetime-local", value: localInput(filters.since) });
  const untilInput = h("input", { name: "until", type: "datetime-local", value: localInput(filters.until) });
  const form = h("form", { class: "filters", id: "task-filters", onsubmit: (event) => {
      event.preventDefault();
      go({ status: statusSelect.value, queue: queueInput.value.trim(),
           operator: operatorInput.value.trim(), since: isoOf(sinceInput.value),
           until: isoOf(untilInput.value), cursor: "" });
    } },
    fixedStatus ? null : h("label", {}, "Status", statusSelect),
    h("label", {}, "Queue", queueInput), h("label", {}, "Operator", operatorInput),
    h("label", {}, "Created since", sinceInput), h("label", {}, "until", untilInput),
    h("button", { type: "submit" }, "Filter"));
  const canReplay = fixedStatus && can("operate");
  const columns = ["Task", "Status", "Attempt", "Queue", "Operator", "Created", "Run time",
                   "Last error"];
  if (canReplay) columns.push("");
  const rows = page.tasks.map((t) => {
    const cells = [taskLink(t.task_id), status(t.status), `${t.attempt}/${t.max_attempts}`,
      t.queue, t.operator, ago(t.created_at), runTime(t),
      h("span", { class: "clip", title: t.last_error || "" },
        (t.last_error || "").split("\n")[0].slice(0, 80))];
    if (canReplay) cells.push(h("button", { class: "replay", dataset: { task: t.task_id },
      onclick: act(() => replay([t.task_id])) }, "Replay"));
    return cells;
  });
  const pager = h("div", { class: "pager" },
    cursor ? h("button", { onclick: () => history.back() }, "← Newer") : null,
    page.next_cursor ? h("button", { id: "older",
      onclick: () => go({ cursor: page.next_cursor }) }, "Older →") : null);
  const scope = [filters.queue && `queue ${filters.queue}`,
    filters.operator && `operator ${filters.operator}`].filter(Boolean).join(", ");
  render(h("h1", {}, title),
    canReplay ? h("div", { class: "actions" }, h("button", { class: "primary", id: "replay-all",
      onclick: act(() => replayAll(filters, scope)) },
      scope ? `Replay all dead tasks of ${scope}` : "Replay all dead tasks")) : null,
    form, table(columns, rows, fixedStatus ? "No dead tasks." : "No tasks match."), pager);
}

// A datetime-local input's value for an ISO time, and back (the browser's time zone).
function localInput(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}
function isoOf(local) { return local ? new Date(local).toISOString() : ""; }

async function replay(ids) {
  const answer = await api("POST", "/tasks/retry", { ids });
  toast(`Replayed ${answer.replayed.length} task(s)`);
  route();
}

// Replays the Dead tasks the page's filters select (queue, operator), 1000 per call.
async function replayAll(filters, scope) {
  if (!confirm(scope ? `Replay every Dead task of ${scope}?` : "Replay every Dead task?")) return;
  const body = { status: "Dead", limit: 1000 };
  if (filters.queue) body.queue = filters.queue;
  if (filters.operator) body.operator = filters.operator;
  let total = 0;
  for (;;) {
    const answer = await api("POST", "/tasks/retry", body);
    total += answer.replayed.length;
    if (answer.replayed.length < 1000) break;
  }
  toast(`Replayed ${total} task(s)`);
  route();
}

async function taskView(taskId) {
  const [t, emitted] = await Promise.all([api("GET", `/tasks/${encodeURIComponent(taskId)}`),
    api("GET", `/tasks/${encodeURIComponent(taskId)}/events`)]);
  const fields = [["Status", status(t.status)], ["Attempt", `${t.attempt} (max_attempts ${t.max_attempts}, renewed by a replay)`],
    ["Counted attempts", `${t.counted_attempts} of ${t.max_attempts}`],
    ["Lost or drained attempts", `${t.processing_attempts} of ${t.max_processing_attempts}`],
    ["Queue", t.queue], ["Priority", `${t.priority} (0 first, 9 last)`],
    ...("concurrency_key" in t ? [["Concurrency key", t.concurrency_key || "—"]] : []),
    ["Operator", t.operator],
    ["Job", t.job ? `${t.job.dag_name} / ${t.job.name}` : "—"], ["Worker", t.worker_id || "—"],
    ["Created", when(t.created_at)], ["Started", when(t.started_at)],
    ["Finished", when(t.finished_at)], ["Run time", runTime(t) || "—"], ["Next retry", when(t.next_retry_at)],
    ["Dead reason", t.dead_reason || "—"], ["Idempotency key", t.idempotency_key || "—"]];
  const terminal = ["Completed", "Dead", "Canceled"].includes(t.status);
  const operate = can("operate");
  const actions = h("div", { class: "actions" },
    operate && ["Dead", "Canceled"].includes(t.status) ? h("button", { class: "primary", id: "replay",
      onclick: act(async () => { await api("POST", `/tasks/${t.task_id}/retry`);
                                 toast("Replayed"); route(); }) }, "Replay") : null,
    operate && !terminal ? h("button", { class: "danger", id: "cancel",
      onclick: act(async () => {
        if (!confirm(`Cancel task ${t.task_id}?`)) return;
        await api("PUT", `/tasks/${t.task_id}/cancel`);
        toast("Canceled"); route();
      }) }, "Cancel") : null);
  render(h("h1", {}, "Task ", h("span", { class: "mono", id: "task-id" }, t.task_id)), actions,
    h("dl", { class: "kv" }, fields.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    h("h2", {}, "Attempts"), attemptsTimeline(t),
    table(["#", "Worker", "Started", "Finished", "Outcome", "Error"], t.attempts.map((a) => [
      a.attempt, a.worker_id, when(a.started_at), when(a.finished_at),
      a.outcome ? status(a.outcome) : "running", (a.error || "").slice(0, 200)]), "Not started."),
    t.last_error ? [h("h2", {}, "Last error"), h("pre", { id: "last-error" }, t.last_error)] : null,
    h("h2", {}, "Result"), h("pre", {}, t.result ? JSON.stringify(t.result, null, 2) : "—"),
    h("h2", {}, "Config"), h("pre", {}, JSON.stringify(t.config, null, 2)),
    h("h2", {}, "Events that started it (inputs)"),
    h("pre", {}, t.inputs.length ? JSON.stringify(t.inputs, null, 2) : "—"),
    h("h2", {}, "Events emitted"),
    h("div", { id: "task-events" }, table(["Attempt", "Cursor / partition", "Dataset", "Version", "Routed", "Tasks started"],
      emitted.events.map((e) => [e.producer ? e.producer.attempt : "",
        e.cursor ?? e.partition_key ?? `${e.start}-${e.end}`,
        h("a", { href: `#/dataset/${e.dataset_uuid}` }, e.dataset_uuid),
        h("span", { class: "mono" }, e.dataset_version),
        e.routed ? "yes" : `no${e.reason ? ` (${e.reason})` : ""}`,
        h("span", {}, (e.tasks || []).map((id) => taskLink(id)))]), "No events.")),
    h("h2", {}, "Outputs"),
    table(["Index", "Dataset", "Version", "Location", "Cursor", "Rows"], t.outputs.map((o) => [
      o.output_index, o.dataset_uuid, o.dataset_version, o.location || "", o.cursor ?? "",
      o.row_count ?? ""]), "No outputs."));
}

function attemptsTimeline(t) {
  if (!t.attempts.length) return null;
  const now = Date.now();
  const times = t.attempts.flatMap((a) => [new Date(a.started_at).getTime(),
    a.finished_at ? new Date(a.finished_at).getTime() : now]);
  const start = Math.min(...times), span = Math.max(1, Math.max(...times) - start);
  const width = 720, row = 22, colors = { Completed: "#1f8a4c", Failed: "#c0392b",
    LeaseExpired: "#b7791f", DeadlineExceeded: "#b7791f", Canceled: "#9aa0a6" };
  const bars = t.attempts.map((a, i) => {
    const s = new Date(a.started_at).getTime();
    const e = a.finished_at ? new Date(a.finished_at).getTime() : now;
    const x = 90 + ((s - start) / span) * (width - 100);
    const w = Math.max(3, ((e - s) / span) * (width - 100));
    return svg("g", {}, svg("text", { x: 0, y: i * row + 15 }, `#${a.attempt}`),
      svg("rect", { x, y: i * row + 4, width: w, height: 14, rx: 3,
                    fill: colors[a.outcome] || "#2f5fd0" },
        svg("title", {}, `${a.outcome || "running"} on ${a.worker_id}`)));
  });
  return h("div", { id: "timeline" },
    svg("svg", { width, height: t.attempts.length * row + 6, role: "img" }, bars));
}

// ---- queues --------------------------------------------------------------------------------

let editingLimits = null; // the queue whose limits form is open (kept across live refreshes)

// A queue's limits and their use now, in words ("none" without limits; docs/queue-limits.md).
function limitsText(q) {
  const l = q.limits, u = q.limits_use, parts = [];
  if (l.concurrency_limit !== null) parts.push(`${u.running} of ${l.concurrency_limit} running`);
  if (l.key_concurrency_limit !== null) {
    parts.push(`${l.key_concurrency_limit} per key (${u.keys_at_limit} key(s) at it)`);
  }
  if (l.rate_limit !== null) {
    parts.push(`${l.rate_limit.per_second}/s, burst ${l.rate_limit.burst} (${u.tokens_left} left)`);
  }
  return parts.length ? parts.join(" · ") : "none";
}

// The admin's form of one queue's limits: the values given replace every limit (an empty field is
// no limit); Clear removes them all. A refusal (422) names the fields the API refused.
function limitsForm(q) {
  const l = q.limits;
  const field = (name, label, value, attrs) => h("label", {}, label, h("input", { name,
    id: `limit-${name}`, type: "number", value: value ?? "", size: 8, ...attrs }));
  const number = (form, name) => {
    const value = form.elements[name].value.trim();
    return value === "" ? null : Number(value);
  };
  const save = async (body) => {
    try {
      const answer = await api("PUT", `/queues/${encodeURIComponent(q.name)}`, body);
      editingLimits = null;
      toast(`${answer.name} limits: ${limitsText(answer)}`);
      route();
    } catch (error) {
      const detail = error instanceof ApiError && error.body && Array.isArray(error.body.detail)
        ? error.body.detail.map((d) => (d.loc || []).filter((p) => p !== "body").join(".")) : [];
      if (detail.length) error.message = `${error.message}: ${detail.join(", ")}`;
      throw error;
    }
  };
  return h("form", { class: "filters", id: "limits-form", dataset: { queue: q.name },
    onsubmit: act(async (event) => {
      event.preventDefault();
      const form = event.target;
      const rate = number(form, "rate"), burst = number(form, "burst");
      await save({ concurrency_limit: number(form, "concurrency"),
                   key_concurrency_limit: number(form, "key-concurrency"),
                   rate_limit: rate === null && burst === null ? null
                     : { per_second: rate, burst } });
    }) },
    h("strong", {}, `Limits of ${q.name}`),
    field("concurrency", "Running at once", l.concurrency_limit, { min: 1, step: 1 }),
    field("key-concurrency", "Running per key", l.key_concurrency_limit, { min: 1, step: 1 }),
    field("rate", "Starts per second", l.rate_limit && l.rate_limit.per_second, { step: "any" }),
    field("burst", "Burst", l.rate_limit && l.rate_limit.burst, { min: 1, step: 1 }),
    h("button", { type: "submit", class: "primary", id: "limits-save" }, "Save limits"),
    h("button", { type: "button", class: "danger", id: "limits-clear",
      onclick: act(async () => { await save({}); }) }, "Clear limits"),
    h("button", { type: "button", id: "limits-cancel",
      onclick: () => { editingLimits = null; route(); } }, "Close"));
}

async function queuesView() {
  const { queues } = await api("GET", "/queues");
  const operate = can("operate"), admin = can("admin");
  const toggle = (q) => h("button", { class: q.paused ? "primary" : "danger",
    dataset: { queue: q.name, action: q.paused ? "resume" : "pause" },
    onclick: act(async () => {
      await api("PUT", `/queues/${encodeURIComponent(q.name)}/${q.paused ? "resume" : "pause"}`);
      toast(`${q.name} ${q.paused ? "resumed" : "paused"}`);
      route();
    }) }, q.paused ? "Resume" : "Pause");
  const edit = (q) => h("button", { dataset: { queue: q.name, action: "limits" },
    onclick: () => { editingLimits = q.name; route(); } }, "Limits");
  const name = h("input", { name: "queue", id: "register-queue", size: 16, required: true,
                            pattern: "[A-Za-z0-9_\\-]{1,64}", placeholder: "new-queue" });
  const register = admin ? h("form", { class: "filters", id: "register",
    onsubmit: act(async (event) => {
      event.preventDefault();
      const answer = await api("PUT", `/queues/${encodeURIComponent(name.value.trim())}`);
      toast(`Queue ${answer.name} registered`);
      route();
    }) }, h("label", {}, "Register a queue", name), h("button", { type: "submit" }, "Register"))
    : null;
  // A queue held by the relay: its SQS queue does not exist, so no wake-up is sent until a
  // probe finds it (docs/operations.md).
  const sqs = (q) => q.sqs.state === "missing"
    ? h("span", { class: "sqs-missing", title: `since ${when(q.sqs.since)}` },
        status("missing"), " next probe ", ago(q.sqs.next_probe_at))
    : "ok";
  const editing = admin ? queues.find((q) => q.name === editingLimits) : undefined;
  render(h("h1", {}, "Queues"), register, editing ? limitsForm(editing) : null, table(
    ["Queue", "State", "SQS queue", "Depth", "Running", "Oldest queued", "Paused since",
     "Limits", ...(operate ? [""] : [])],
    queues.map((q) => [q.name, q.paused ? status("paused") : "running", sqs(q), q.depth,
      q.running, age(q.oldest_queued_age_seconds), q.paused_at ? ago(q.paused_at) : "",
      h("span", { class: "limits", dataset: { queue: q.name } }, limitsText(q)),
      ...(operate ? [h("span", { class: "actions-cell" }, toggle(q),
                       admin ? edit(q) : null)] : [])]), "No queues."));
}

// ---- workers and the audit log -------------------------------------------------------------

async function workersView() {
  const { workers, lost_after_seconds: lostAfter } = await api("GET", "/workers");
  render(h("h1", {}, "Workers"),
    h("div", { class: "muted" }, `Workers that reported lately; lost after ${age(lostAfter)} of silence.`),
    table(["Worker", "State", "Queues", "Slots", "Running", "Version", "Last seen", "Since"],
      workers.map((w) => [h("span", { class: "mono" }, w.worker_id),
        status(w.state), w.queues.join(", "), w.slots,
        h("span", { class: "running" }, `${w.running.length} `, w.running.map((id) => taskLink(id))),
        w.version, h("time", { datetime: w.last_seen, title: when(w.last_seen) },
          `${age(w.seconds_since_seen)} ago`), ago(w.first_seen)]),
      "No worker has reported yet."));
}

async function auditView(params) {
  const filters = { key: params.get("key") || "", action: params.get("action") || "",
                    since: params.get("since") || "" };
  const cursor = params.get("cursor") || "";
  const query = new URLSearchParams({ limit: "50" });
  for (const [k, v] of Object.entries(filters)) if (v) query.set(k, v);
  if (cursor) query.set("cursor", cursor);
  const page = await api("GET", `/audit?${query}`);
  const go = (extra) => {
    const next = new URLSearchParams();
    for (const [k, v] of Object.entries({ ...filters, ...extra })) if (v) next.set(k, v);
    location.hash = `#/audit?${next}`;
  };
  const keyInput = h("input", { name: "key", value: filters.key, size: 14 });
  const actionInput = h("input", { name: "action", value: filters.action, size: 16 });
  const sinceInput = h("input", { name: "since", type: "datetime-local", value: localInput(filters.since) });
  const form = h("form", { class: "filters", onsubmit: (event) => {
      event.preventDefault();
      go({ key: keyInput.value.trim(), action: actionInput.value.trim(),
           since: isoOf(sinceInput.value), cursor: "" });
    } },
    h("label", {}, "Key", keyInput), h("label", {}, "Action", actionInput),
    h("label", {}, "Since", sinceInput), h("button", { type: "submit" }, "Filter"));
  render(h("h1", {}, "Audit log"), form,
    table(["When", "Key", "Action", "Target", "Outcome"], page.entries.map((e) => [
      ago(e.at), e.key_name, e.action,
      e.target && UUID.test(e.target) ? taskLink(e.target) : (e.target || ""), e.outcome]),
      "No operate or admin call recorded."),
    h("div", { class: "pager" },
      cursor ? h("button", { onclick: () => history.back() }, "← Newer") : null,
      page.next_cursor ? h("button", { onclick: () => go({ cursor: page.next_cursor }) },
        "Older →") : null));
}

// ---- DAGs and datasets ---------------------------------------------------------------------

function listOf(answer, key) {
  if (Array.isArray(answer)) return answer;
  return (answer && Array.isArray(answer[key])) ? answer[key] : [];
}

function jobsOf(dag) {
  const jobs = dag.jobs || {};
  if (Array.isArray(jobs)) return jobs.map((j) => [j.name || j.job, j]);
  return Object.entries(jobs);
}

async function dagsView() {
  let answer;
  try { answer = await api("GET", "/dags"); } catch (e) { return render(h("h1", {}, "DAGs"), unavailable("DAGs", e)); }
  const dags = listOf(answer, "dags");
  render(h("h1", {}, "DAGs"), table(["DAG", "Jobs"], dags.map((d) => {
    const name = d.dag_name || d.name;
    return [h("a", { href: `#/dag/${encodeURIComponent(name)}` }, name),
      Array.isArray(d.jobs) || (d.jobs && typeof d.jobs === "object") ? jobsOf(d).length : (d.jobs ?? "")];
  }), "No DAGs applied yet."));
}

async function dagView(name) {
  let dag;
  try { dag = await api("GET", `/dags/${encodeURIComponent(name)}`); }
  catch (e) { return render(h("h1", {}, `DAG ${name}`), unavailable("DAGs", e)); }
  render(h("h1", {}, `DAG ${name}`), dagGraph(dag),
    h("h2", {}, "Jobs"), table(["Job", "Operator", "Queue", "Schedule", "Outputs"],
      jobsOf(dag).map(([job, spec]) => [job, spec.operator || "", spec.queue || "",
        spec.schedule || "", (spec.outputs || []).map((o) => o.dataset || o.dataset_uuid).join(", ")])));
}

function dagGraph(dag) {
  const jobs = jobsOf(dag);
  const producers = {};
  for (const [job, spec] of jobs) {
    for (const out of spec.outputs || []) {
      if (out.dataset) producers[out.dataset] = job;
      if (out.dataset_uuid) producers[out.dataset_uuid] = job;
    }
  }
  const edges = [];
  for (const [job, spec] of jobs) {
    for (const input of spec.inputs || []) {
      const from = input.from || input;
      const upstream = from.job || producers[from.dataset] || producers[from.dataset_uuid];
      if (upstream && upstream !== job) edges.push([upstream, job]);
    }
  }
  const level = Object.fromEntries(jobs.map(([job]) => [job, 0]));
  for (let i = 0; i < jobs.length; i++) {
    for (const [a, b] of edges) level[b] = Math.max(level[b], level[a] + 1);
  }
  const columns = {};
  for (const [job] of jobs) (columns[level[job]] = columns[level[job]] || []).push(job);
  const pos = {};
  const boxW = 150, boxH = 34, gapX = 60, gapY = 20;
  for (const [col, names] of Object.entries(columns)) {
    names.forEach((job, i) => { pos[job] = { x: 10 + col * (boxW + gapX), y: 10 + i * (boxH + gapY) }; });
  }
  const width = 20 + (Object.keys(columns).length) * (boxW + gapX);
  const height = 20 + Math.max(1, ...Object.values(columns).map((c) => c.length)) * (boxH + gapY);
  const lines = edges.map(([a, b]) => svg("line", { x1: pos[a].x + boxW, y1: pos[a].y + boxH / 2,
    x2: pos[b].x, y2: pos[b].y + boxH / 2, stroke: "#6b7280", "marker-end": "url(#arrow)" }));
  const boxes = jobs.map(([job]) => svg("g", {},
    svg("rect", { x: pos[job].x, y: pos[job].y, width: boxW, height: boxH, rx: 5,
                  fill: "#fff", stroke: "#2f5fd0" }),
    svg("text", { x: pos[job].x + 8, y: pos[job].y + 21 }, job.slice(0, 22))));
  return h("div", { id: "dag-graph" }, svg("svg", { width, height, role: "img" },
    svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
      markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" },
      svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#6b7280" }))), lines, boxes));
}

async function datasetsView() {
  let answer;
  try { answer = await api("GET", "/datasets"); }
  catch (e) { return render(h("h1", {}, "Datasets"), unavailable("Datasets", e)); }
  render(h("h1", {}, "Datasets"), table(["Dataset", "Kind", "Current version", "UUID"],
    listOf(answer, "datasets").map((d) => [
      h("a", { href: `#/dataset/${d.dataset_uuid}` }, d.name || d.dataset_uuid), d.kind || "",
      h("span", { class: "mono" }, d.dataset_version || d.current_version || ""),
      h("span", { class: "mono" }, d.dataset_uuid)]), "No datasets yet."));
}

async function datasetView(uuid) {
  let dataset, events;
  try {
    [dataset, events] = await Promise.all([api("GET", `/datasets/${encodeURIComponent(uuid)}`),
      api("GET", `/datasets/${encodeURIComponent(uuid)}/events`)]);
  } catch (e) { return render(h("h1", {}, "Dataset"), unavailable("Datasets", e)); }
  const versions = listOf(dataset, "versions");
  render(h("h1", {}, `Dataset ${dataset.name || uuid}`),
    h("dl", { class: "kv" }, [["UUID", dataset.dataset_uuid], ["Kind", dataset.kind],
      ["Location", dataset.location], ["Current version", dataset.dataset_version || dataset.current_version],
      ["Latest cursor", dataset.latest_cursor]].flatMap(([k, v]) =>
      [h("dt", {}, k), h("dd", { class: "mono" }, v ?? "—")])),
    h("h2", {}, "Versions"), h("div", { id: "dataset-versions" }, table(
      ["Version", "Created", "Current since", "Became current", "Superseded", ""],
      versions.map((v) => [h("span", { class: "mono" }, v.dataset_version),
        when(v.created_at), v.current ? when(v.current_since) : "—", v.became_current || "",
        when(v.superseded_at),
        v.current ? status("Current") : can("operate") ? h("button", { class: "danger rollback",
          dataset: { version: v.dataset_version },
          onclick: act(() => rollBack(dataset, v.dataset_version)) }, "Roll back") : ""]), "—")),
    h("h2", {}, "Events"), table(["Cursor / partition", "Version", "Producer", "Routed", "Tasks"],
      listOf(events, "events").map((e) => [e.cursor ?? e.partition_key ?? "",
        h("span", { class: "mono" }, e.dataset_version), e.producer ? taskLink(e.producer.task_id) : "",
        e.routed ? "yes" : `no${e.reason ? ` (${e.reason})` : ""}`,
        h("span", {}, (e.tasks || []).map((id) => taskLink(id)))]), "No events yet."));
}

async function rollBack(dataset, version) {
  if (!confirm(`Make version ${version} of ${dataset.name || dataset.dataset_uuid} current again? ` +
               "Live tasks pinned to the current version will be canceled.")) return;
  const answer = await api("POST", `/datasets/${encodeURIComponent(dataset.dataset_uuid)}/current`,
    { dataset_version: version });
  toast(`Rolled back: ${answer.canceled_tasks} task(s) canceled`);
  route();
}

// ---- routing -------------------------------------------------------------------------------

// A live refresh renders only if the person is still on its page; a page the person opens
// waits for a refresh in flight, so it always renders last.
let inflight = Promise.resolve();
let opening = 0; // pages being opened by the person (no live refresh meanwhile)
async function route(quiet) {
  if (!sessionStorage.getItem(KEY)) return loginView();
  if (quiet === true) {
    routing = true;
    refreshing = location.hash;
    inflight = show(true).finally(() => { routing = false; refreshing = null; });
    await inflight;
  } else {
    opening += 1;
    try {
      await inflight.catch(() => {});
      await show(false);
    } finally { opening -= 1; }
  }
  stamp();
}

async function show(quiet) {
  document.getElementById("nav").hidden = false;
  const [path, query] = (location.hash.slice(1) || "/").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  for (const link of document.querySelectorAll("nav a")) {
    const target = link.getAttribute("href").slice(2);
    link.classList.toggle("active", target === (parts[0] || ""));
  }
  try {
    if (!parts.length) await overviewView();
    else if (parts[0] === "tasks") await tasksView(params, "Tasks");
    else if (parts[0] === "task") await taskView(parts[1]);
    else if (parts[0] === "dead") await tasksView(params, "Dead tasks", "Dead");
    else if (parts[0] === "queues") await queuesView();
    else if (parts[0] === "workers") await workersView();
    else if (parts[0] === "audit") await auditView(params);
    else if (parts[0] === "dags") await dagsView();
    else if (parts[0] === "dag") await dagView(parts[1]);
    else if (parts[0] === "datasets") await datasetsView();
    else if (parts[0] === "dataset") await datasetView(parts[1]);
    else render(h("div", { class: "empty" }, "No such page."));
  } catch (error) {
    if (quiet && !(error instanceof ApiError && error.status === 401)) {
      document.getElementById("updated").textContent = `refresh failed: ${error.message}`;
      return;
    }
    if (error instanceof ApiError && error.status === 401) {
      sessionStorage.removeItem(KEY);
      return loginView("The API key was refused; log in again.");
    }
    render(h("div", { class: "error", id: "page-error" }, `Error: ${error.message}`));
  }
}

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  location.hash = "#/";
  loginView();
});
window.addEventListener("hashchange", () => { window.scrollTo(0, 0); route(); });

// ---- live refresh and search ---------------------------------------------------------------

function stamp() {
  const live = sessionStorage.getItem(LIVE) !== "off";
  const toggle = document.getElementById("live");
  toggle.textContent = live ? "Live" : "Paused";
  toggle.classList.toggle("on", live);
  toggle.setAttribute("aria-pressed", String(live));
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}
function editing() {
  const el = document.activeElement;
  return el && main.contains(el) && ["INPUT", "SELECT", "TEXTAREA"].includes(el.tagName);
}
document.getElementById("live").addEventListener("click", () => {
  const live = sessionStorage.getItem(LIVE) !== "off";
  sessionStorage.setItem(LIVE, live ? "off" : "on");
  stamp();
});
setInterval(() => {
  if (sessionStorage.getItem(LIVE) === "off" || document.hidden || routing || opening || editing()) {
    return;
  }
  if (!sessionStorage.getItem(KEY) || document.getElementById("nav").hidden) return;
  // Each read of the audit log is itself audited: that page refreshes only when asked.
  if (location.hash.startsWith("#/audit")) return;
  route(true);
}, REFRESH_MS);

document.getElementById("search").addEventListener("submit", act(async (event) => {
  event.preventDefault();
  const input = document.getElementById("search-input");
  const wanted = input.value.trim();
  if (!wanted) return;
  if (UUID.test(wanted)) {
    try {
      await api("GET", `/tasks/${encodeURIComponent(wanted)}`);
      input.value = "";
      location.hash = `#/task/${wanted.toLowerCase()}`;
      return;
    } catch (error) { if (!(error instanceof ApiError && error.status === 404)) throw error; }
  }
  const page = await api("GET", `/tasks?${new URLSearchParams({ idempotency_key: wanted })}`);
  if (!page.tasks.length) return toast(`No task has the id or idempotency key "${wanted}"`, true);
  input.value = "";
  location.hash = `#/task/${page.tasks[0].task_id}`;
}));
route();
