// The sluice web console: plain JavaScript, no build step. Every call goes
// to the controller's API with the operator's token (sessionStorage) as a
// bearer token; the API authenticates each. Data is put into the page as
// text (textContent), never as markup.
"use strict";

const TOKEN_KEY = "sluice-token";
const REFRESH_MS = 2000;
let timer = null;
const charts = new Map(); // port → {plot, box}

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") e.className = v;
    else if (k === "data") Object.assign(e.dataset, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmtBps(v) {
  if (v === null || v === undefined) return "unlimited";
  const units = [[1e9, "Gbps"], [1e6, "Mbps"], [1e3, "Kbps"]];
  for (const [d, u] of units) {
    if (Math.abs(v) >= d) return (v / d).toFixed(2).replace(/\.?0+$/, "") + " " + u;
  }
  return v.toFixed(0) + " bps";
}

function fmtTime(s) {
  if (!s || s.startsWith("0001-")) return "-";
  return new Date(s).toLocaleString();
}

class APIError extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error : "HTTP " + status);
    this.status = status;
    this.body = body;
  }
}

async function api(method, path, body) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) throw new APIError(401, {error: "no token"});
  const opts = {method, headers: {"Authorization": "Bearer " + token}, cache: "no-store"};
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
  const data = await resp.json().catch(() => null);
  if (!resp.ok) throw new APIError(resp.status, data);
  return data;
}

function table(id, head, rows) {
  const t = document.getElementById(id);
  t.replaceChildren(el("tr", {}, ...head.map((h) => el("th", {}, h))));
  for (const r of rows) {
    t.append(el("tr", {}, ...r.map((c) => (c instanceof Node && c.tagName === "TD") ? c : el("td", {}, c))));
  }
}

const num = (v) => el("td", {class: "num"}, v);

async function showHosts() {
  const hosts = await api("GET", "/v1/hosts");
  table("hosts-table", ["host", "agent", "VMs placed", "VMs running (report)", "uplinks", "vNIC reservations held", "last report"],
    hosts.map((h) => [h.name, h.registered ? "registered" : "none", h.vms.join(", ") || "-",
      h.report ? (h.report.vms || []).join(", ") || "-" : "-", h.uplinks.join(", ") || "-",
      num(fmtBps(h.reserved_bps)), h.report ? fmtTime(h.report.time) : "-"]));
}

async function showVMs() {
  const vms = await api("GET", "/v1/vms");
  const rows = [];
  for (const v of vms) {
    const nics = v.nics.length ? v.nics : [null];
    for (const n of nics) {
      rows.push([v.name, v.host || "-", v.observed || "-", el("td", {class: "state-" + v.state}, v.state), fmtTime(v.since),
        n ? n.port : "-", n ? n.uplink || "-" : "-", num(n ? fmtBps(n.reservation_bps) : "-"), num(n ? n.shares : "-"),
        num(n ? fmtBps(n.limit_bps) : "-"), num(n ? fmtBps(n.alloc_bps) : "-")]);
    }
  }
  table("vms-table", ["VM", "desired host", "observed host", "state", "since", "port", "uplink", "reservation", "shares", "limit", "entitlement"], rows);
}

function chartFor(port) {
  let c = charts.get(port);
  if (c) return c;
  const box = el("div", {class: "chart", data: {port: port, points: "0"}}, el("h3", {}, port));
  document.getElementById("charts").append(box);
  const opts = {
    width: 460, height: 220,
    scales: {x: {time: true}, y: {range: (u, min, max) => [0, Math.max(max * 1.1, 1)]}},
    axes: [{}, {label: "Mbps", size: 60}],
    series: [{}, {label: "entitled", stroke: "#1f6fd1", width: 2}, {label: "measured", stroke: "#d1601f", width: 2}],
  };
  const plot = new uPlot(opts, [[], [], []], box);
  c = {plot, box};
  charts.set(port, c);
  return c;
}

async function showCharts() {
  const h = await api("GET", "/v1/history");
  document.getElementById("charts-note").textContent =
    `Each agent report's measured rate beside the port's entitlement then, over the last ${h.window_s / 60} minutes ` +
    `(at most ${h.max_samples} samples a port, kept in the controller's memory). ` + (h.ports.length ? "Ports that neither are entitled to nor send 1 Mbps are left out." : "No report with measured rates yet.");
  // A port that neither is entitled to nor sends 1 Mbps (a system class
  // without traffic) gets no chart.
  const busy = h.ports.filter((p) => p.samples.some((s) => Math.max(s.entitled_bps, s.measured_bps) >= 1e6));
  for (const p of busy) {
    const c = chartFor(p.port);
    const xs = [], ent = [], meas = [];
    for (const s of p.samples) {
      xs.push(Date.parse(s.time) / 1000);
      ent.push(s.entitled_bps / 1e6);
      meas.push(s.measured_bps / 1e6);
    }
    c.plot.setData([xs, ent, meas]);
    c.box.dataset.points = String(xs.length);
    const last = p.samples[p.samples.length - 1];
    c.box.querySelector("h3").textContent = `${p.port} on ${last.host}: entitled ${fmtBps(last.entitled_bps)}, measured ${fmtBps(last.measured_bps)}`;
  }
}

// The newest 200 events: read once from the first on (the API pages
// oldest first), then only those after the last one read.
const events = {list: [], after: 0};

async function showEvents() {
  for (let i = 0; i < 100; i++) {
    const page = await api("GET", "/v1/events?after=" + events.after + "&limit=1000");
    if (!page.length) break;
    events.list = events.list.concat(page).slice(-200);
    events.after = page[page.length - 1].seq;
  }
  table("events-table", ["#", "time", "kind", "subject", "message", "reason"],
    events.list.slice().reverse().map((e) => [num(e.seq), fmtTime(e.time), e.kind, e.subject, e.message, e.reason]));
}

async function fillPorts() {
  const vms = await api("GET", "/v1/vms");
  const list = document.getElementById("ports");
  list.replaceChildren(...vms.flatMap((v) => v.nics.map((n) => el("option", {value: n.port}))));
}

async function explain(ev) {
  ev.preventDefault();
  const port = document.getElementById("explain-port").value.trim();
  const out = document.getElementById("explain-out");
  out.textContent = "…";
  try {
    const e = await api("GET", "/v1/explain?port=" + encodeURIComponent(port));
    out.textContent = e.lines.join("\n");
  } catch (err) {
    out.textContent = err.message;
    handleAuth(err);
  }
}

async function whatIf(ev) {
  ev.preventDefault();
  const changes = document.getElementById("whatif-changes").value.split("\n").map((s) => s.trim()).filter((s) => s);
  const out = document.getElementById("whatif-out");
  out.replaceChildren(el("p", {}, "…"));
  let w;
  try {
    w = await api("POST", "/v1/what-if", {changes});
  } catch (err) {
    out.replaceChildren(el("p", {class: "error"}, err.message));
    handleAuth(err);
    return;
  }
  const parts = [];
  if (!w.admitted) {
    parts.push(el("p", {class: "refused", id: "whatif-verdict"}, "Refused: " + w.refusal));
    for (const d of w.details || []) parts.push(el("p", {}, d));
    parts.push(el("p", {}, `Decided on policy revision ${w.revision}; nothing was changed.`));
    out.replaceChildren(...parts);
    return;
  }
  parts.push(el("p", {class: "ok", id: "whatif-verdict"}, `Admitted (policy revision ${w.revision}, DRS ${w.drs}); nothing was changed.`));
  const tbl = (id, head, rows) => {
    const t = el("table", {id});
    t.append(el("tr", {}, ...head.map((h) => el("th", {}, h))));
    for (const r of rows) t.append(el("tr", {}, ...r.map((c) => (c instanceof Node) ? c : el("td", {}, c))));
    return t;
  };
  parts.push(el("h3", {}, "Migrations"));
  parts.push(w.moves.length ? tbl("whatif-moves", ["VM", "from", "to", "status", "why"], w.moves.map((m) => [m.vm, m.from, m.to, m.status, m.reason]))
    : el("p", {id: "whatif-moves"}, "none"));
  parts.push(el("h3", {}, "Rates after (every demand unbounded, migrations carried out)"));
  parts.push(tbl("whatif-rates", ["port", "uplink after", "rate now", "rate after"],
    w.rates.map((r) => [r.port, r.uplink, num(r.before_uplink ? fmtBps(r.before_bps) + " on " + r.before_uplink : "-"), num(fmtBps(r.alloc_bps))])));
  parts.push(el("h3", {}, "Where the VMs would run"));
  parts.push(tbl("whatif-hosts", ["host", "VMs"], w.hosts.map((h) => [h.host, h.vms.join(", ")])));
  if (w.faults && w.faults.length) {
    parts.push(el("h3", {}, "Still faults after the migrations"));
    for (const f of w.faults) parts.push(el("p", {class: "error"}, f));
  }
  parts.push(el("h3", {}, "Events it would record"));
  parts.push(tbl("whatif-events", ["kind", "subject", "message", "reason"], w.events.map((e) => [e.kind, e.subject, e.message, e.reason])));
  out.replaceChildren(...parts);
}

const pages = {
  "hosts": showHosts,
  "vms": showVMs,
  "charts": showCharts,
  "events": showEvents,
  "explain": fillPorts,
  "what-if": null,
};
const live = new Set(["hosts", "vms", "charts", "events"]);

function handleAuth(err) {
  if (err instanceof APIError && err.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    document.getElementById("login-error").textContent = "The controller refused the token: " + err.message;
    route();
    return true;
  }
  return false;
}

async function refresh(name) {
  const f = pages[name];
  if (f) {
    try {
      await f();
      document.getElementById("error").textContent = "";
    } catch (err) {
      if (!handleAuth(err)) document.getElementById("error").textContent = err.message;
    }
  }
  document.body.dataset.loaded = name;
}

function route() {
  clearInterval(timer);
  const signedIn = !!sessionStorage.getItem(TOKEN_KEY);
  document.getElementById("login").hidden = signedIn;
  document.getElementById("nav").hidden = !signedIn;
  let name = location.hash.replace(/^#/, "");
  if (!(name in pages)) name = "hosts";
  for (const s of document.querySelectorAll(".page")) s.hidden = !signedIn || s.id !== "page-" + name;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("current", a.dataset.page === name);
  if (!signedIn) {
    document.getElementById("token").focus();
    return;
  }
  document.body.dataset.loaded = "";
  refresh(name);
  if (live.has(name)) timer = setInterval(() => refresh(name), REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const tok = document.getElementById("token").value.trim();
    sessionStorage.setItem(TOKEN_KEY, tok);
    document.getElementById("token").value = "";
    try {
      await api("GET", "/v1/hosts");
      document.getElementById("login-error").textContent = "";
    } catch (err) {
      if (handleAuth(err)) return;
    }
    route();
  });
  document.getElementById("signout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    route();
  });
  document.getElementById("explain-form").addEventListener("submit", explain);
  document.getElementById("whatif-form").addEventListener("submit", whatIf);
  window.addEventListener("hashchange", route);
  route();
});
