// The dashboard page: polls api/state, renders the tables, offers the two actions.
"use strict";

const FAMILIES = [
  ["lock", "Locks and permits"],
  ["claim", "Enqueue claims"],
  ["queue", "Queues"],
  ["burst", "Debounce schedules"],
  ["throttle", "Throttle schedules"],
  ["rate", "Rates"],
  ["beat", "Beat slots"],
];
const view = { session: null, cursors: {}, timer: null, task: "", search: "", gen: 0 };

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function secs(s) {
  if (s === null || s === undefined) return "-";
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  return (s / 3600).toFixed(1) + " h";
}

function when(epoch, now) {
  if (!epoch) return "-";
  const d = epoch - now;
  const at = new Date(epoch * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z";
  return at + (d >= 0 ? " (in " + secs(d) + ")" : " (" + secs(-d) + " ago)");
}

function banner(text) {
  const b = $("banner");
  b.hidden = !text;
  b.textContent = text || "";
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({ credentials: "same-origin" }, options || {}));
  let body = null;
  try { body = await response.json(); } catch (e) { body = { error: response.statusText }; }
  if (!response.ok) {
    const err = new Error(body && body.error ? body.error : response.status + " " + response.statusText);
    err.status = response.status;
    throw err;
  }
  return body;
}

async function post(path, data) {
  const s = view.session || {};
  return api(path, {
    method: "POST",
    // a site hosting the dashboard (Django) names its own CSRF header
    headers: { "Content-Type": "application/json", [s.csrf_header || "X-CSRF-Token"]: s.csrf || "" },
    body: JSON.stringify(data || {}),
  });
}

// -- session -------------------------------------------------------------------

async function start() {
  try {
    view.session = await api("api/session");
  } catch (e) {
    banner("Cannot reach the dashboard: " + e.message);
    setTimeout(start, 2000);
    return;
  }
  const s = view.session;
  if (s.auth === "token" && !s.authenticated) { showLogin(); return; }
  if (s.actions && s.authenticated && !s.csrf) {
    const done = await post("api/login", {});  // basic auth: open a session for the CSRF token
    s.csrf = done.csrf;
  }
  $("login").hidden = true;
  poll();
}

function showLogin() {
  $("login").hidden = false;
  $("status").textContent = "log in to see the locks";
}

$("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    await post("api/login", { token: $("token").value });
    $("token").value = "";
    $("login-error").textContent = "";
    start();
  } catch (e) {
    $("login-error").textContent = e.message;
  }
});

// -- polling -------------------------------------------------------------------

function query() {
  const q = new URLSearchParams();
  if (view.task) q.set("task", view.task);
  for (const [k, v] of Object.entries(view.cursors)) if (v) q.set("cursor." + k, v);
  return q.toString();
}

async function poll() {
  clearTimeout(view.timer);
  const gen = ++view.gen;  // a newer poll (a click) supersedes this one
  let refresh = (view.session && view.session.refresh) || 1.5;
  try {
    const state = await api("api/state?" + query());
    if (gen !== view.gen) return;
    refresh = state.refresh || refresh;
    banner("");
    render(state);
    $("status").textContent = "updated " + new Date(state.time * 1000).toLocaleTimeString() +
      " · read in " + state.elapsed_ms + " ms";
  } catch (e) {
    if (e.status === 401) { showLogin(); return; }
    if (gen !== view.gen) return;
    banner("Reading the lock nodes failed: " + e.message + " (retrying)");
  }
  view.timer = setTimeout(poll, refresh * 1000);
}

function matches(row) {
  if (!view.search) return true;
  const ids = [row.task_id, row.claimant, row.runs, row.sent_by].filter(Boolean);
  return ids.some((id) => String(id).includes(view.search));
}

// The cursor to read next time: stay on a page that shows rows; walk on (one page
// per refresh) past pages that show nothing; start over once a pass ended.
function advance(id, family, shown) {
  if (shown > 0) return;
  if (family.next) view.cursors[id] = family.next;
  else if (view.cursors[id]) delete view.cursors[id];
}

// -- rendering -----------------------------------------------------------------

function render(state) {
  const board = el("div", { id: "groups" });
  state.groups.forEach((group, g) => board.append(renderGroup(state, group, g)));
  $("board").replaceChildren(board);
}

function renderGroup(state, group, g) {
  const box = el("section", { class: "group", "data-group": g });
  const answered = group.answered + " of " + group.nodes_total + " nodes answered, quorum " + group.quorum;
  box.append(el("h2", {}, "Nodes of " + group.label + " ", el("span", { class: "muted" }, "prefix " + group.prefix + " · " + answered)));
  if (group.error) box.append(el("div", { class: "banner group-error" }, "Quorum lost: " + group.error));
  if (group.about) box.append(el("div", { class: "about muted" }, group.about));
  box.append(nodesTable(group));
  for (const line of group.findings) {
    const level = line.split(" ", 1)[0];
    box.append(el("div", { class: "finding " + level }, line));
  }
  for (const [kind, title] of FAMILIES) {
    const family = group.families[kind];
    let rows = family.rows;
    if (kind === "lock") rows = rows.concat(group.families.permit.rows);
    const shown = rows.filter(matches);
    const id = g + "." + kind;
    box.append(el("h3", {}, title + " ", el("span", { class: "muted" }, "(" + shown.length + " on this page)")));
    box.append(pager(g, kind, family));
    box.append(TABLES[kind](state, group, g, shown));
    advance(id, family, shown.length);
    if (kind === "lock") advance(g + ".permit", group.families.permit, shown.length);
  }
  return box;
}

function pager(g, kind, family) {
  const id = g + "." + kind;
  const first = !view.cursors[id];
  const bar = el("div", { class: "pager muted" });
  bar.append(first ? "first page" : "a later page");
  if (!first) bar.append(el("button", { type: "button", class: "first-page", onclick: () => { delete view.cursors[id]; poll(); } }, "« first page"));
  if (family.next) bar.append(el("button", { type: "button", class: "next-page", onclick: () => { view.cursors[id] = family.next; poll(); } }, "next page »"));
  else bar.append(" · end of the key space");
  return bar;
}

function nodesTable(group) {
  // the kind-neutral columns, then only the settings each node's own kind has
  const head = ["Node", "State", "RTT", "Version", "Role", "Replicas", "Durability"];
  const rows = group.nodes.map((n) => n.up
    ? el("tr", { class: "node up " + n.kind, "data-node": n.node },
        el("td", { class: "mono" }, n.node), el("td", { class: "state" }, el("span", { class: "badge up" }, "up")),
        el("td", { class: "num" }, n.rtt_ms + " ms"), el("td", {}, n.version), el("td", {}, n.role),
        el("td", { class: "num" }, n.replicas === null ? "-" : n.replicas),
        el("td", { class: "checks" }, n.checks.length ? n.checks.map((c) =>
          el("span", { class: c.unsafe ? "check error" : "check" }, c.label + " " + c.value + (c.unsafe ? " (unsafe)" : ""))) : "-"))
    : el("tr", { class: "node down " + n.kind, "data-node": n.node },
        el("td", { class: "mono" }, n.node), el("td", { class: "state" }, el("span", { class: "badge down" }, "DOWN")),
        el("td", { colspan: 5, class: "error" }, n.error)));
  return table(head, rows, "nodes");
}

function table(head, rows, cls) {
  const t = el("table", { class: cls });
  t.append(el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))));
  const body = el("tbody", {}, rows);
  if (!rows.length) body.append(el("tr", { class: "empty" }, el("td", { colspan: head.length, class: "muted" }, "none on this page")));
  t.append(body);
  return t;
}

function taskCell(row) {
  const name = row.tasks && row.tasks.length ? row.tasks.join(", ") : row.lock_name;
  return el("td", {}, name, row.tasks && row.tasks.length && row.tasks[0] !== row.lock_name ? el("div", { class: "muted" }, "lock " + row.lock_name) : null);
}

const TABLES = {
  lock(state, group, g, rows) {
    const head = ["Task / lock", "Digest", "Permit", "Holder task id", "Host", "Pid", "Age (seen)", "Time left", "Token", "Nodes", ""];
    return table(head, rows.map((r) => {
      const tr = el("tr", { class: "row lock" + (r.suspect ? " suspect" : ""), "data-key": r.key, "data-task-id": r.task_id || "" },
        taskCell(r), el("td", { class: "mono" }, r.digest ? r.digest.slice(0, 12) : "-"), el("td", { class: "num" }, r.permit),
        el("td", { class: "mono holder" }, r.held ? (r.task_id || r.owner) : (r.known ? "free" : "unknown"),
          r.suspect ? el("span", { class: "badge suspect", title: "no renewal seen for " + secs(r.since_renewal) }, " suspect") : null),
        el("td", {}, r.host || "-"), el("td", { class: "num" }, r.pid || "-"),
        el("td", { class: "num" }, r.age === null ? "-" : "≥ " + secs(r.age)),
        el("td", { class: "num left" }, secs(r.remaining)),
        el("td", { class: "mono" }, r.fence || "-"),
        el("td", { class: "num" }, r.votes + "/" + r.nodes.length),
        el("td", {}, actionButton("release", r.held && r.owner, () => confirmRelease(g, r))));
      return tr;
    }), "locks");
  },
  claim(state, group, g, rows) {
    const head = ["Task / lock", "Digest", "Claimant", "State", "Time left", "Nodes", ""];
    return table(head, rows.map((r) => el("tr", { class: "row claim", "data-key": r.key },
      taskCell(r), el("td", { class: "mono" }, r.digest.slice(0, 12) || "-"),
      el("td", { class: "mono claimant" }, r.claimant || (r.known ? "-" : "unknown")),
      el("td", {}, r.state || "-"), el("td", { class: "num left" }, secs(r.remaining)),
      el("td", { class: "num" }, r.votes + "/" + r.nodes_total),
      el("td", {}, actionButton("withdraw", r.state === "queued", () => confirmWithdraw(g, r))))), "claims");
  },
  queue(state, group, g, rows) {
    const head = ["Task / lock", "Digest", "Waiting", "Next call", "Oldest waiting", "Nodes"];
    return table(head, rows.map((r) => el("tr", { class: "row queue", "data-key": r.key },
      taskCell(r), el("td", { class: "mono" }, r.digest.slice(0, 12) || "-"),
      el("td", { class: "num" }, r.known ? String(r.waiting) : "unknown"),
      el("td", { class: "mono" }, r.next || "-"),
      el("td", { class: "num" }, r.oldest_age === null || r.oldest_age === undefined ? "-" : secs(r.oldest_age)),
      el("td", { class: "num" }, r.known ? r.answered + " answered" : "-"))), "queues");
  },
  burst(state, group, g, rows) {
    const head = ["Task / lock", "Digest", "Burst began", "Next run due", "Claimant", "Time left", "Nodes"];
    return table(head, rows.map((r) => el("tr", { class: "row burst", "data-key": r.key },
      taskCell(r), el("td", { class: "mono" }, r.digest.slice(0, 12) || "-"),
      el("td", {}, when(r.burst_started, state.time)), el("td", {}, when(r.due, state.time)),
      el("td", { class: "mono" }, r.claimant || "-"), el("td", { class: "num left" }, secs(r.remaining)),
      el("td", { class: "num" }, r.votes + "/" + r.nodes_total))), "bursts");
  },
  throttle(state, group, g, rows) {
    const head = ["Task / lock", "Digest", "Next run due", "Runs", "Last start", "Period", "Time left", "Nodes"];
    return table(head, rows.map((r) => el("tr", { class: "row throttle", "data-key": r.key },
      taskCell(r), el("td", { class: "mono" }, r.digest.slice(0, 12) || "-"),
      el("td", {}, when(r.due, state.time)), el("td", { class: "mono" }, r.runs || "-"),
      el("td", {}, when(r.last_start, state.time)), el("td", { class: "num" }, r.period ? secs(r.period) : "-"),
      el("td", { class: "num left" }, secs(r.remaining)), el("td", { class: "num" }, r.votes + "/" + r.nodes_total))), "throttles");
  },
  rate(state, group, g, rows) {
    const head = ["Task / lock", "Digest", "Type", "State", "Time left", "Nodes"];
    return table(head, rows.map((r) => el("tr", { class: "row rate", "data-key": r.key },
      taskCell(r), el("td", { class: "mono" }, r.digest.slice(0, 12) || "-"), el("td", {}, r.type),
      el("td", { class: "mono" }, JSON.stringify(r.value)), el("td", { class: "num left" }, secs(r.remaining)),
      el("td", { class: "num" }, r.votes + "/" + r.nodes_total))), "rates");
  },
  beat(state, group, g, rows) {
    const head = ["Entry", "Slot (UTC)", "Sent by", "Nodes", "Time left"];
    return table(head, rows.map((r) => el("tr", { class: "row beat", "data-key": r.key },
      el("td", {}, r.entry), el("td", {}, r.slot_time + " ", el("span", { class: "muted" }, r.slot)),
      el("td", { class: "mono" }, r.sent_by), el("td", { class: "num" }, r.votes + "/" + r.nodes_total),
      el("td", { class: "num left" }, secs(r.remaining)))), "beats");
  },
};

// -- actions -------------------------------------------------------------------

function actionButton(label, possible, onclick) {
  const s = view.session;
  if (!s || !s.actions || !s.csrf || !possible) return null;
  return el("button", { type: "button", class: "action " + label, onclick }, label);
}

function ask(title, text, warning) {
  return new Promise((resolve) => {
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-warning").textContent = warning;
    $("confirm").hidden = false;
    const done = (answer) => {
      $("confirm").hidden = true;
      $("confirm-ok").onclick = $("confirm-cancel").onclick = null;
      resolve(answer);
    };
    $("confirm-ok").onclick = () => done(true);
    $("confirm-cancel").onclick = () => done(false);
  });
}

async function act(path, data) {
  try {
    const done = await post(path, data);
    banner("");
    $("status").textContent = done.message;
  } catch (e) {
    banner("Not done: " + e.message);
  }
  poll();
}

async function confirmRelease(g, r) {
  const holder = "task " + (r.task_id || "-") + " on host " + (r.host || "?") + ", pid " + (r.pid || "?");
  const ok = await ask("Release " + r.key + "?",
    "Holder: " + holder + " (owner " + r.owner + "), " + secs(r.remaining) + " left.",
    "If that holder is still running, another execution may start at once.");
  if (ok) act("api/release", { group: g, name: r.name, permit: r.permit, owner: r.owner });
}

async function confirmWithdraw(g, r) {
  const ok = await ask("Withdraw the claim " + r.key + "?",
    "Claimed by task " + r.claimant + ", " + secs(r.remaining) + " left.",
    "Later calls are queued again; that task still runs if its message exists.");
  if (ok) act("api/withdraw", { group: g, name: r.name, claimant: r.claimant });
}

// -- filters -------------------------------------------------------------------

let typing = null;
$("task-filter").addEventListener("input", () => {
  clearTimeout(typing);
  typing = setTimeout(() => { view.task = $("task-filter").value.trim(); view.cursors = {}; poll(); }, 300);
});
$("id-search").addEventListener("input", () => { view.search = $("id-search").value.trim(); });
$("filters").addEventListener("submit", (event) => event.preventDefault());

start();
