// The dashboard's charts of the last hour (GET /api/fleet/charts), drawn as plain SVG.
// Lane and tenant names are anyone's strings: they only ever go in as text nodes and
// attribute values (textContent, setAttribute), never as markup.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
// The time axis: the shortest of these (seconds) that holds every sample, and its ticks.
const WINDOWS = [[120, 30], [300, 60], [900, 300], [1800, 600], [3600, 900]];
const LANES_DRAWN = 8; // the server sends at most this many and "other"; never draw more
const TENANTS_DRAWN = 6;
const PALETTE = ["#4b8cf7", "#3ba55d", "#e0a030", "#b07cf0", "#2ec4c4", "#e5708a"];
const OTHER_COLOR = "#777";

function node(name, attrs = {}, text = undefined, ns = SVG_NS) {
  const element = ns ? document.createElementNS(ns, name) : document.createElement(name);
  for (const [key, value] of Object.entries(attrs)) element.setAttribute(key, String(value));
  if (text !== undefined) element.textContent = String(text);
  return element;
}
const tag = (name, attrs = {}, text = undefined) => node(name, attrs, text, null);

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

const number = (value) =>
  value >= 100 ? Math.round(value).toString() : String(Math.round(value * 10) / 10);

function duration(seconds) {
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${number(seconds)} s`;
  if (seconds < 3600) return `${number(seconds / 60)} min`;
  return `${number(seconds / 3600)} h`;
}

function percent(share) {
  if (share === null) return "–";
  return share > 0 && share < 0.005 ? "<1%" : `${Math.round(share * 100)}%`;
}

// Seconds before now at which sample i ended, and the window that shows them all.
const endedAgo = (charts, i) => charts.age + (charts.samples - 1 - i) * charts.step;
const windowOf = (charts) =>
  WINDOWS.find(([span]) => span >= endedAgo(charts, 0)) || WINDOWS[WINDOWS.length - 1];

const tickLabel = (ago) => (!ago ? "now" : ago < 60 || ago % 60 ? `−${ago} s` : `−${ago / 60} min`);

// A line's path, one run per stretch of non-null values; x from each sample's age.
function pathOf(charts, values, x, y, span) {
  let d = "";
  let open = false;
  values.forEach((value, i) => {
    const ago = endedAgo(charts, i);
    if (value === null || ago > span) {
      open = false;
      return;
    }
    d += `${open ? "L" : "M"}${x(ago).toFixed(1)},${y(value).toFixed(1)}`;
    open = true;
  });
  return d;
}

// The area under a line's path: each run closed down to `base`.
function areaOf(d, base) {
  return d.split("M").filter(Boolean).map((run) => {
    const points = run.split("L");
    const first = points[0].split(",")[0], last = points[points.length - 1].split(",")[0];
    return `M${first},${base}L${run}L${last},${base}Z`;
  }).join("");
}

// A time chart `width` pixels wide: `series` are {name, cls, values, area}; 0 at the bottom.
function timeChart(charts, series, unit, width) {
  const height = 150, left = 40, right = 14, top = 10, bottom = 22;
  const [span, tick] = windowOf(charts);
  const plotW = width - left - right, plotH = height - top - bottom;
  const max = niceMax(Math.max(0, ...series.flatMap((s) => s.values.filter((v) => v !== null))));
  const x = (ago) => left + plotW * (1 - ago / span);
  const y = (value) => top + plotH * (1 - value / max);
  const svg = node("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "chart" });
  for (const fraction of [0, 0.5, 1]) {
    const at = y(max * fraction);
    svg.append(node("line", { x1: left, x2: width - right, y1: at, y2: at, class: "grid" }));
    svg.append(node("text", { x: left - 6, y: at + 4, class: "axis", "text-anchor": "end" },
      number(max * fraction)));
  }
  for (let ago = span; ago >= 0; ago -= tick) {
    const anchor = ago === span ? "start" : ago === 0 ? "end" : "middle";
    svg.append(node("text", { x: x(ago), y: height - 5, class: "axis", "text-anchor": anchor },
      tickLabel(ago)));
  }
  svg.append(node("text", { x: left + 6, y: top + 11, class: "axis" }, unit));
  for (const s of series) {
    const d = pathOf(charts, s.values, x, y, span);
    if (s.area && d) svg.append(node("path", { d: areaOf(d, y(0)), class: `area ${s.cls}` }));
    svg.append(node("path", { d, class: `line ${s.cls}`, "data-series": s.name }));
    const newest = s.values.length - 1;
    if (newest >= 0 && s.values[newest] !== null) { // a point even before there is a line
      svg.append(node("circle", {
        cx: x(endedAgo(charts, newest)), cy: y(s.values[newest]), r: 2.5, class: `dot ${s.cls}`,
      }));
    }
  }
  return svg;
}

function legend(items) {
  const list = tag("div", { class: "legend" });
  for (const item of items) {
    const entry = tag("span", { "data-series": item.name });
    entry.append(tag("i", { class: `swatch ${item.cls}` }), tag("b", {}, item.value),
      ` ${item.name}`);
    list.append(entry);
  }
  return list;
}

const collecting = (charts) => [tag("p", { class: "dim" },
  `collecting: a point every ${charts.step} s, the first within ${charts.step} s`)];

function throughputChart(charts, width) {
  const t = charts.throughput;
  if (!charts.samples) return collecting(charts);
  return [
    timeChart(charts, [
      { name: "completed", cls: "c-completed", values: t.completed, area: true },
      { name: "failed", cls: "c-failed", values: t.failed },
    ], "prompts / min", width),
    legend([
      { name: "completed", cls: "c-completed", value: t.totals.completed },
      { name: "failed", cls: "c-failed", value: t.totals.failed },
      { name: "interrupted or cancelled", cls: "c-stopped", value: t.totals.stopped },
    ]),
  ];
}

function queueChart(charts, width) {
  const q = charts.queue;
  if (!charts.samples) return collecting(charts);
  const last = (values) => values[values.length - 1];
  return [
    timeChart(charts, [
      { name: "pending", cls: "c-pending", values: q.peak, area: true },
      { name: "running", cls: "c-running", values: q.running },
    ], "prompts", width),
    legend([
      { name: "pending (the most in the last sample)", cls: "c-pending", value: last(q.peak) },
      { name: "running (on average)", cls: "c-running", value: number(last(q.running)) },
    ]),
  ];
}

function sparkline(charts, values) {
  const width = 300, height = 22;
  const [span] = windowOf(charts);
  const x = (ago) => width * (1 - ago / span);
  const y = (value) => 1 + (height - 2) * (1 - value);
  const svg = node("svg", {
    viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", class: "spark",
  });
  svg.append(node("rect", { x: 0, y: 0, width, height, class: "spark-bg" }));
  const d = pathOf(charts, values, x, y, span);
  if (d) {
    svg.append(node("path", { d: areaOf(d, height), class: "area c-running" }));
    svg.append(node("path", {
      d, class: "line c-running", "vector-effect": "non-scaling-stroke",
    }));
  }
  return svg;
}

function lanesChart(charts) {
  if (!charts.samples) return collecting(charts);
  const table = tag("table");
  const head = table.createTHead().insertRow();
  for (const [title, cls] of [["lane", ""], ["busy", ""], ["avg", "num"],
    ["idle gaps", "num"], ["mean gap", "num"]]) {
    head.append(tag("th", { class: cls }, title));
  }
  const body = table.createTBody();
  const named = charts.lanes.filter((lane) => lane.name !== null).slice(0, LANES_DRAWN);
  const other = charts.lanes.find((lane) => lane.name === null);
  for (const lane of other ? [...named, other] : named) {
    const row = tag("tr", lane.name === null ? { "data-other": "yes" } : { "data-lane": lane.name });
    const label = lane.name === null ? "other lanes" : lane.name.replace(/^backend:/, "");
    const spark = tag("td", { class: "spark" });
    spark.append(sparkline(charts, lane.utilization));
    row.append(
      tag("td", { class: "label", title: lane.name ?? "" }, label),
      spark,
      tag("td", { class: "num" }, percent(lane.average)),
      tag("td", { class: "num" }, lane.gaps),
      tag("td", { class: "num" }, lane.gaps ? duration(lane.gap_mean) : "–"),
    );
    body.append(row);
  }
  return [table];
}

function tenantsChart(charts) {
  if (!charts.samples) return collecting(charts);
  const shares = charts.tenants.shares;
  if (!shares.length) return [tag("p", { class: "dim" }, "no prompt ran in the last hour")];
  const named = shares.filter((s) => s.name !== null).slice(0, TENANTS_DRAWN);
  const rest = shares.filter((s) => !named.includes(s));
  const drawn = [...named];
  if (rest.length) {
    drawn.push({
      name: null,
      seconds: rest.reduce((sum, s) => sum + s.seconds, 0),
      share: rest.reduce((sum, s) => sum + s.share, 0),
    });
  }
  const width = 1000, height = 18;
  const bar = node("svg", {
    viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", class: "share",
  });
  const table = tag("table");
  const body = table.createTBody();
  let at = 0;
  drawn.forEach((s, i) => {
    const color = s.name === null ? OTHER_COLOR : PALETTE[i % PALETTE.length];
    const name = s.name ?? "other tenants";
    const rect = node("rect", { x: at, y: 0, width: s.share * width, height, fill: color });
    rect.append(node("title", {}, `${name}: ${percent(s.share)}`));
    bar.append(rect);
    at += s.share * width;
    const row = tag("tr", s.name === null ? { "data-other": "yes" } : { "data-tenant": s.name });
    const label = tag("td", { class: "label", title: name });
    label.append(tag("i", { class: "swatch", style: `background:${color}` }), name);
    row.append(label, tag("td", { class: "num" }, percent(s.share)),
      tag("td", { class: "num dim" }, `${duration(s.seconds)} of slot time`));
    body.append(row);
  });
  return [bar, table];
}

function failureRow(failure, now, admin) {
  const row = tag("tr", { "data-job": failure.id });
  const inNode = failure.node_type ? `${failure.node_type} #${failure.node_id}` : null;
  const where = [failure.lane, inNode].filter(Boolean).join(" · ");
  const why = [failure.exception_type, failure.message].filter(Boolean).join(": ");
  const prompt = tag("td");
  prompt.append(tag("code", {}, String(failure.id).slice(0, 8)));
  row.append(tag("td", {}, `${duration(Math.max(0, now - failure.finished))} ago`), prompt);
  if (admin) row.append(tag("td", { class: "label", title: failure.tenant }, failure.tenant));
  row.append(tag("td", { class: "label", title: where }, where),
    tag("td", { class: "message", title: why }, why));
  return row;
}

// Each chart's panel and what fills it; a chart the server leaves out (null: it counts
// every tenant's prompts, and the viewer is no admin) hides its panel.
const CHARTS = [
  ["chart-throughput", "throughput", throughputChart],
  ["chart-queue", "queue", queueChart],
  ["chart-lanes", "lanes", lanesChart],
  ["chart-tenants", "tenants", tenantsChart],
];
let chartsShown = null;

function drawCharts(charts) {
  chartsShown = charts;
  for (const [id, key, draw] of CHARTS) {
    const body = document.getElementById(id);
    const panel = body.closest(".panel");
    panel.hidden = charts[key] === null;
    if (panel.hidden) continue;
    body.classList.remove("dim");
    body.replaceChildren(...draw(charts, Math.max(280, body.clientWidth)));
  }
  const [span] = windowOf(charts);
  document.getElementById("charts-note").textContent = charts.samples
    ? `a point every ${charts.step} s · the last ${span < 3600 ? `${span / 60} min` : "hour"}`
    : "";
}

function drawFailures(failures, now, admin) {
  document.getElementById("failures").replaceChildren(
    ...failures.map((failure) => failureRow(failure, now, admin)));
  document.getElementById("failures-none").hidden = failures.length > 0;
  document.getElementById("failures-table").hidden = failures.length === 0;
  document.getElementById("failures-tenant").hidden = !admin;
}

let resizing = null;
window.addEventListener("resize", () => {
  clearTimeout(resizing);
  resizing = setTimeout(() => chartsShown && drawCharts(chartsShown), 150);
});
