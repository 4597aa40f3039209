// The broker's web UI: services (GET /ui/api/status), live events (EventSource on
// /ui/api/events), one log at a time (tail, then follow by byte offset), recent runs, and
// start / stop / restart per service (POST with the page's CSRF token). No framework, no
// build step: every value goes into the page as text, never as HTML.
"use strict";

const csrf = document.querySelector('meta[name="harness-csrf"]').content;
const $ = (id) => document.getElementById(id);
const EVENTS_SHOWN = 300;

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function duration(s) {
  if (s === null || s === undefined) return "";
  if (s < 60) return `${s.toFixed(0)} s`;
  if (s < 3600) return `${(s / 60).toFixed(0)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function who(entry) {
  const parts = [entry.client];
  if (entry.run) parts.push(`run ${entry.run}`);
  if (entry.pid) parts.push(`pid ${entry.pid}`);
  return parts.join(", ");
}

async function call(method, path, body) {
  const options = { method, headers: {}, credentials: "same-origin" };
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.headers["X-Harness-CSRF"] = csrf;
    options.body = JSON.stringify(body);
  }
  const response = await fetch(path, options);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `${response.status} ${response.statusText}`);
  return data;
}

async function act(action, name) {
  $("message").textContent = `${action} ${name} ...`;
  try {
    const answer = await call("POST", `/ui/api/${action}`, { name });
    const outcome = Object.entries(answer.results).map(([k, v]) => `${k}: ${v === null ? "ready" : v}`);
    $("message").textContent = `${name}: ${outcome.join(", ")}`;
  } catch (error) {
    $("message").textContent = `${name}: ${error.message}`;
  }
  refreshStatus();
}

function serviceRow(row) {
  const tr = document.createElement("tr");
  const holders = (row.holders || []).map(who).join("; ");
  const waiters = (row.waiters || []).map(who).join("; ");
  const cells = [
    row.name, row.swap ? `${row.mode} (swap ${row.swap})` : row.mode, row.gpu === null ? "CPU" : row.gpu, null, row.incarnation,
    duration(row.uptime_s), `${row.leases}${holders ? ` (${holders})` : ""}`,
    `${row.waiting}${waiters ? ` (${waiters})` : ""}`, bytes(row.memory_bytes), bytes(row.gpu_memory_bytes),
    row.restarts, row.crashes,
  ];
  cells.forEach((value, i) => {
    const td = el("td", i === 3 ? null : value, i === 6 ? "holders" : "");
    if (i === 3) td.append(el("span", row.state + (row.foreign ? " (foreign)" : ""), `state ${row.state}`));
    tr.append(td);
  });
  const buttons = el("td");
  if (row.mode === "resident" || row.mode === "on_demand") {
    for (const action of ["start", "stop", "restart"]) {
      const button = el("button", action);
      button.type = "button";
      button.dataset.action = action;
      button.dataset.service = row.name;
      button.addEventListener("click", () => act(action, row.name));
      buttons.append(button);
    }
  }
  tr.append(buttons);
  return tr;
}

async function refreshStatus() {
  try {
    const status = await call("GET", "/ui/api/status");
    const body = $("services").tBodies[0];
    body.replaceChildren(...status.services.map(serviceRow));
    const b = status.broker;
    $("broker").textContent = `pid ${b.pid} · ${b.state_dir} · ${b.runs.length} run(s) joined`;
    const select = $("log-name");
    const names = ["broker", ...status.services.map((s) => s.name)];
    if ([...select.options].map((o) => o.value).join() !== names.join()) {
      const chosen = select.value;
      select.replaceChildren(...names.map((n) => { const o = el("option", n); o.value = n; return o; }));
      if (names.includes(chosen)) select.value = chosen;
    }
  } catch (error) {
    $("message").textContent = `status: ${error.message}`;
  }
}

let pending = null;
function refreshSoon() {  // a burst of events (a swap, a restart) costs one status read
  if (pending === null) pending = setTimeout(() => { pending = null; refreshStatus(); }, 300);
}

function showEvent(event) {
  const list = $("events");
  const time = new Date(event.time * 1000).toLocaleTimeString();
  const rest = Object.entries(event)
    .filter(([k, v]) => !["seq", "time", "event", "service"].includes(k) && v !== null)
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(" ");
  list.prepend(el("li", `${time} #${event.seq} ${event.event} ${event.service || "-"} ${rest}`, event.event));
  while (list.children.length > EVENTS_SHOWN) list.lastChild.remove();
}

function connectEvents() {
  const source = new EventSource("/ui/api/events");
  const kinds = ["start", "ready", "start_failed", "stop", "stopped", "crash", "lease", "release", "refused",
    "scoped_reset", "added", "removed"];
  for (const kind of kinds) {
    source.addEventListener(kind, (message) => {
      showEvent(JSON.parse(message.data));
      if (kind !== "lease" && kind !== "release") refreshSoon();
    });
  }
  source.onopen = () => { $("connection").textContent = "live"; $("connection").className = "state live"; };
  source.onerror = () => { $("connection").textContent = "reconnecting"; $("connection").className = "state lost"; };
}

const log = { name: null, offset: null, file: null };

async function followLog() {
  const name = $("log-name").value;
  if (name && (name !== log.name || $("log-follow").checked)) {
    const fresh = name !== log.name;
    const query = fresh || log.offset === null ? "" : `&offset=${log.offset}&file=${log.file}`;
    try {
      const answer = await call("GET", `/ui/api/logs?name=${encodeURIComponent(name)}${query}`);
      const pre = $("log");
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      if (fresh || answer.reset) pre.textContent = "";
      pre.append(answer.text);
      if (pre.textContent.length > 1 << 20) pre.textContent = pre.textContent.slice(-(1 << 19));
      if (atEnd || fresh) pre.scrollTop = pre.scrollHeight;
      log.name = name;
      log.offset = answer.offset;
      log.file = answer.file;
    } catch (error) {
      $("message").textContent = `log: ${error.message}`;
    }
  }
  setTimeout(followLog, 1000);
}

async function refreshRuns() {
  try {
    const answer = await call("GET", "/ui/api/runs");
    const rows = answer.runs.map((run) => {
      const tr = document.createElement("tr");
      const started = run.started ? new Date(run.started * 1000).toLocaleString() : "";
      for (const value of [run.id, started, run.exit_status, run.score]) tr.append(el("td", value));
      const cell = el("td");
      if (run.report) {
        const link = el("a", "report");
        link.href = `/ui/runs/${encodeURIComponent(run.id)}/report`;
        cell.append(link);
      } else {
        cell.append(el("code", `harness report ${run.id}`));
      }
      tr.append(cell);
      return tr;
    });
    if (!rows.length) {
      const none = el("td", answer.known ? "no runs recorded yet" : "this broker does not know where runs are recorded");
      none.colSpan = 5;
      rows.push(el("tr"));
      rows[0].append(none);
    }
    $("runs").tBodies[0].replaceChildren(...rows);
  } catch (error) {
    $("message").textContent = `runs: ${error.message}`;
  }
}

refreshStatus();
refreshRuns();
connectEvents();
followLog();
setInterval(refreshStatus, 5000);
setInterval(refreshRuns, 30000);
