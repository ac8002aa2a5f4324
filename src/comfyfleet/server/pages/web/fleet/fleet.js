// The fleet dashboard: renders each snapshot the server sends on /api/fleet/ws.
"use strict";

const base = location.pathname.replace(/\/fleet\/?$/, "");
const $ = (id) => document.getElementById(id);
const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const esc = (value) => String(value ?? "").replace(/[&<>"']/g, (c) => ESCAPES[c]);
const gigabytes = (bytes) => (typeof bytes === "number" ? `${(bytes / 1e9).toFixed(1)} GB` : "?");

// A worker's devices as its backend reports them: "NVIDIA L4 (cuda) 23.6 GB".
function devicesText(machine) {
  return (machine.devices || [])
    .map((d) => `${d.name ?? "?"} (${d.type ?? "?"}) ${gigabytes(d.vram_total)}`)
    .join(", ");
}
const short = (id) => esc(String(id).slice(0, 8));
let received = 0;
let admin = false;
let chartsDrawn = null; // the newest sample drawn (a snapshot's `charts`)
let chartsLoading = false;

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}${base}/api/fleet/ws`);
  socket.onopen = () => {
    $("conn").textContent = "live";
    chartsDrawn = null; // a restarted server counts its samples from 0 again
  };
  socket.onmessage = (message) => {
    received += 1;
    $("snapshots").textContent = received;
    render(JSON.parse(message.data));
  };
  socket.onclose = () => {
    $("conn").textContent = "reconnecting…";
    setTimeout(connect, 1000);
  };
}

function button(label, method, path, own = true) {
  // Admin actions; a job can be cancelled by its own tenant's token only.
  return admin && own
    ? `<button class="admin" data-method="${method}" data-path="${esc(path)}">${label}</button>`
    : "";
}

function lanes(snapshot) {
  return snapshot.lanes.map((lane) => {
    const state = lane.suspect && lane.state === "up" ? "suspect" : lane.state;
    const name = esc(lane.backend || lane.name);
    let actions = "";
    if (lane.kind === "backend") {
      const path = `/api/fleet/backends/${encodeURIComponent(lane.backend)}`;
      // Only the gateway that dispatches to a backend drains or resumes it.
      if (lane.state === "draining") actions = button("resume", "POST", `${path}/resume`);
      else if (lane.state !== "elsewhere") actions = button("drain", "POST", `${path}/drain`);
      actions += button("remove", "DELETE", path);
    }
    if (lane.kind === "worker") {
      // A worker: where it connected from, when it last spoke, what it can run.
      const seen = Math.max(0, snapshot.time - lane.worker.seen_at).toFixed(0);
      const from = lane.worker.address ? ` from ${esc(lane.worker.address)}` : "";
      const machine = lane.worker.machine ? `, ${esc(devicesText(lane.worker.machine))}` : "";
      actions = `<span class="dim">worker${from}, heard ${seen} s ago, ${lane.node_classes} node classes${machine}</span>`;
    }
    return `<tr data-lane="${esc(lane.name)}"><td title="${esc(lane.url)}">${name}</td>
      <td class="state ${state}">${state}</td><td>${lane.slots}</td>
      <td>${lane.running.map(short).join(" ")}</td><td>${lane.prefetched.map(short).join(" ")}</td>
      <td>${lane.set_aside_count ?? ""}</td><td>${actions}</td></tr>`;
  }).join("");
}

function counts(queue) {
  const parts = [["pending", queue.pending], ["running", queue.running]];
  for (const [status, count] of Object.entries(queue.finished)) parts.push([status, count]);
  return parts.map(([name, value]) =>
    `<span id="count-${name}"><b>${value}</b> ${name}</span>`).join("");
}

function pending(queue) {
  return queue.head.map((job) => `<tr data-job="${esc(job.id)}"><td><code>${short(job.id)}</code></td>
    <td>${esc(job.number)}</td><td>${job.wait.toFixed(1)} s</td><td>${esc(job.set_aside_for)}</td>
    <td>${button("cancel", "POST", `/api/jobs/${encodeURIComponent(job.id)}/cancel`, job.own)}</td></tr>`).join("");
}

// A prompt's id, and for a child prompt (Run on the Fleet, Tiles on the Fleet) its parent's.
function promptCell(job) {
  const parent = job.parent
    ? ` <span class="dim" data-parent="${esc(job.parent)}">of <code>${short(job.parent)}</code></span>`
    : "";
  return `<td><code>${short(job.id)}</code>${parent}</td>`;
}

function running(jobs) {
  return jobs.map((job) => {
    const share = job.max > 0 ? Math.min(100, (100 * job.value) / job.max) : 0;
    return `<tr data-job="${esc(job.id)}">${promptCell(job)}<td>${esc(job.lane)}</td>
      <td class="state ${esc(job.state)}">${esc(job.state)}</td><td>${esc(job.node)}</td>
      <td><span class="bar"><span style="width:${share}%"></span></span></td>
      <td>${job.seconds.toFixed(1)} s</td>
      <td>${button("cancel", "POST", `/api/jobs/${encodeURIComponent(job.id)}/cancel`, job.own)}</td></tr>`;
  }).join("");
}

function collectors(list) {
  if (!list.length) return "none running";
  return list.map((c) => `<div data-collector="${esc(c.prompt_id)}:${esc(c.node)}">
    <code>${short(c.prompt_id)}</code> node ${esc(c.node)} · ${esc(c.mode)}
    ${c.live ? "(waiting)" : "(done)"}<div class="slots">${c.slots.map((s) =>
      `<span class="slot ${esc(s.state)}" title="slot ${s.slot}: ${esc(s.state)} ${esc(s.error ?? "")}">${s.slot}</span>`).join("")}
    </div></div>`).join("");
}

function tenants(list) {
  return list.map((t) => {
    const caps = [];
    if (t.max_running !== null) caps.push(`${t.max_running} running`);
    if (t.max_queued !== null) caps.push(`${t.max_queued} queued`);
    if (t.lanes.length) caps.push(`lanes ${t.lanes.join(", ")}`);
    const share = Math.round(100 * t.share);
    return `<tr data-tenant="${esc(t.tenant)}"><td>${esc(t.tenant)}</td><td>${t.pending}</td>
      <td>${t.running}</td><td><span class="bar"><span style="width:${share}%"></span></span>
      ${share} %</td><td>${esc(t.weight)}</td><td>${esc(t.priority)}</td>
      <td>${esc(caps.join(" · ") || "none")}</td><td>${t.paid_jobs_today}</td>
      <td>$${Number(t.spend_today).toFixed(2)}</td></tr>`;
  }).join("");
}

function recent(list) {
  return list.map((job) => `<tr data-job="${esc(job.id)}">${promptCell(job)}
    <td class="state ${esc(job.status)}">${esc(job.status)}</td><td>${esc(job.lane)}</td>
    <td>${job.seconds.toFixed(2)}</td></tr>`).join("");
}

function gallery(outputs) {
  return outputs.map((image) => {
    const query = new URLSearchParams({
      filename: image.filename, subfolder: image.subfolder, type: image.type, preview: "webp;50",
    });
    return `<img loading="lazy" alt="${esc(image.filename)}" title="${esc(image.filename)}"
      src="${base}/api/view?${query}">`;
  }).join("");
}

function render(snapshot) {
  admin = snapshot.admin;
  document.body.dataset.admin = admin ? "yes" : "no";
  $("lanes").innerHTML = lanes(snapshot);
  $("counts").innerHTML = counts(snapshot.queue);
  $("pending").innerHTML = pending(snapshot.queue);
  $("running").innerHTML = running(snapshot.running);
  $("collectors").innerHTML = collectors(snapshot.collectors);
  $("recent").innerHTML = recent(snapshot.recent);
  $("tenants").innerHTML = tenants(snapshot.tenants);
  drawFailures(snapshot.failures, snapshot.time, admin);
  if (chartsDrawn === null || snapshot.charts > chartsDrawn) loadCharts();
  const shown = snapshot.outputs.map((o) => o.filename).join("\n");
  if ($("gallery").dataset.shown !== shown) {  // images reload only when the list changes
    $("gallery").dataset.shown = shown;
    $("gallery").innerHTML = gallery(snapshot.outputs);
  }
}

// The charts change once per sample: read them when the snapshot says a new one closed.
async function loadCharts() {
  if (chartsLoading) return;
  chartsLoading = true;
  try {
    const answer = await fetch(`${base}/api/fleet/charts`);
    if (answer.ok) {
      const charts = await answer.json();
      drawCharts(charts);
      chartsDrawn = charts.seq;
    }
  } catch {
    // Not read (the connection dropped): the next snapshot asks again.
  } finally {
    chartsLoading = false;
  }
}

document.addEventListener("click", async (event) => {
  const target = event.target.closest("button.admin");
  if (!target) return;
  target.disabled = true;
  const answer = await fetch(base + target.dataset.path, { method: target.dataset.method });
  if (!answer.ok) alert(`${target.textContent}: HTTP ${answer.status}`);
});

connect();
