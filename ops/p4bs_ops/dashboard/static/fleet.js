// The fleet: every link's state, filtered, sorted and paged by the server (/api/fleet).
"use strict";

const PAGE = 100;
const view = { q: "", sla: "", sort: "link", order: "asc", offset: 0 };
const COLUMNS = [
  ["link", "link"], [null, "capacity"], ["sla", "SLA"], ["buffer", "buffer"],
  ["policy", "policy"], ["phase", "phase"], ["decision", "last decision"], [null, "outcome"],
  ["alerts", "open alerts"], ["f", "f"], ["utilisation", "utilisation"], [null, "SRTT"], [null, "N"],
];

function controls() {
  const search = el("input", { type: "search", id: "filter", placeholder: "link, policy or phase" });
  search.addEventListener("input", () => { view.q = search.value; view.offset = 0; load(); });
  const sla = el("select", { id: "sla" }, el("option", { value: "" }, "any SLA state"),
    ...["violated", "ok", "no data"].map((s) => el("option", { value: s }, s)));
  sla.addEventListener("change", () => { view.sla = sla.value; view.offset = 0; load(); });
  const prev = el("button", { id: "prev", onclick: () => { view.offset = Math.max(0, view.offset - PAGE); load(); } }, "◀");
  const next = el("button", { id: "next", onclick: () => { view.offset += PAGE; load(); } }, "▶");
  return el("div", { class: "controls" }, search, sla, prev, next, el("span", { id: "count" }));
}

function header() {
  return el("tr", {}, ...COLUMNS.map(([key, title]) => {
    if (!key) return el("th", {}, title);
    const mark = view.sort === key ? (view.order === "asc" ? " ▲" : " ▼") : "";
    return el("th", { class: "sortable", "data-sort": key, onclick: () => {
      view.order = view.sort === key && view.order === "asc" ? "desc" : "asc";
      view.sort = key; view.offset = 0; load();
    } }, title + mark);
  }));
}

function row(r, nowNs) {
  const d = r.last_decision;
  const alerts = r.open_alerts.map(alertText).join(", ");
  const link = el("a", { href: `/link/${encodeURIComponent(r.link_id)}` }, r.link_id);
  const policy = r.policy === "p4bs"
    ? el("a", { href: `/search/${encodeURIComponent(r.link_id)}` }, r.policy) : r.policy;
  return el("tr", { "data-link": r.link_id, "data-sla": r.sla },
    el("td", {}, link), el("td", {}, fmt.rate(r.capacity_bps)),
    el("td", { class: `sla-${r.sla.replace(" ", "-")}` }, r.sla),
    el("td", {}, `${fmt.bytes(r.buffer_bytes)} (${fmt.ms(r.buffer_ns)})`),
    el("td", {}, policy), el("td", {}, r.phase ?? "–"),
    el("td", { title: d ? d.reason : "" }, d ? `${fmt.bytes(d.buffer_bytes)}, ${fmt.ago(d.ts_ns, nowNs)}` : "–"),
    el("td", { class: d ? `outcome-${d.outcome}` : "" }, d ? d.outcome : "–"),
    el("td", { class: alerts ? "sla-violated" : "" }, alerts || "–"),
    el("td", {}, fmt.num(r.f)), el("td", {}, fmt.pct(r.utilisation)),
    el("td", {}, fmt.ms(r.srtt_ns)), el("td", {}, r.long_flows ?? "–"));
}

async function load() {
  const params = new URLSearchParams({ ...view, limit: PAGE });
  try {
    const page = await getJSON(`/api/fleet?${params}`);
    const table = document.getElementById("fleet");
    table.replaceChildren(header(), ...page.rows.map((r) => row(r, page.now_ns)));
    const last = Math.min(page.offset + page.rows.length, page.matched);
    document.getElementById("count").textContent =
      `${page.matched ? page.offset + 1 : 0}–${last} of ${page.matched} (${page.total} links; ` +
      `${page.sla_counts.violated} out of SLA)`;
    document.getElementById("prev").disabled = page.offset === 0;
    document.getElementById("next").disabled = last >= page.matched;
    showFeed(page.feed);
    window.p4bs.fleet = { rows: page.rows.length, matched: page.matched, total: page.total };
  } catch (error) {
    document.getElementById("count").textContent = String(error);
  }
}

document.getElementById("main").append(el("h1", {}, "Fleet"), controls(), el("table", { id: "fleet" }));
load();
// The fleet is polled (one page of rows): pushing every link's windows would be thousands a second.
setInterval(load, 2000);
