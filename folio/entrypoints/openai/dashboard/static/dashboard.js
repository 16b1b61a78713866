// folio's live engine view: reads /v1/engine/state/stream (server-sent events, ~4 a second) and
// draws the KV block map, the queues, the counters and the per-second series. Plain JS, no build
// step. The stream is read with fetch() rather than EventSource so that the API key can travel in
// the Authorization header (never in a URL that logs would keep).
"use strict";

const STREAM_PATH = "v1/engine/state/stream";  // relative: behind a proxy's --root-path prefix too
const KEY_STORAGE = "folio-dashboard-key";
const COLOURS = { f: "#e6e6e6", c: "#9ecae1", o: "#31a354", s: "#e6550d", w: "#756bb1" };
const STATE_NAMES = { f: "free", c: "cached, evictable", o: "owned", s: "shared", w: "swapped to CPU" };
const MAX_MAP_HEIGHT = { "block-map": 360, "cpu-map": 90 };  // px; past it, several blocks share a cell
// A cell holding several blocks shows the most telling of their states, in this order.
const PRECEDENCE = ["f", "c", "w", "o", "s"];

const view = {
  state: null,        // the last state received
  owners: new Map(),  // device block id -> request ids holding it (from the listed requests)
  cpuOwners: new Map(),
  hover: null,        // Set of request ids whose blocks are highlighted, or null
  updates: 0,
  controller: null,
};
window.folioDashboard = view;  // for tests and curious operators

const $ = (id) => document.getElementById(id);

// ---- the API key ---------------------------------------------------------------------------------
// /dashboard#key=KEY (never sent to the server, so never in its access log) or ?key=KEY: the key is
// kept for this tab only and taken out of the address bar.
function takeKeyFromUrl() {
  const url = new URL(window.location.href);
  const fromHash = new URLSearchParams(url.hash.slice(1)).get("key");
  const key = fromHash !== null ? fromHash : url.searchParams.get("key");
  if (key !== null) {
    sessionStorage.setItem(KEY_STORAGE, key);
    url.searchParams.delete("key");
    window.history.replaceState(null, "", url.pathname + url.search);
  }
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function askForKey(message) {
  $("key-form").hidden = false;
  $("key-error").textContent = message;
  setConnection("needs API key", "down");
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_STORAGE, $("key-input").value.trim());
  $("key-form").hidden = true;
  reconnect();
});

// ---- the stream ------------------------------------------------------------------------------------
function setConnection(text, kind) {
  const pill = $("connection");
  pill.textContent = text;
  pill.className = `pill ${kind || ""}`;
}

async function connect() {
  const controller = new AbortController();
  view.controller = controller;
  const blocks = $("show-blocks").checked ? 1 : 0;
  let response;
  try {
    response = await fetch(`${STREAM_PATH}?blocks=${blocks}`, { headers: authHeaders(), signal: controller.signal });
  } catch (error) {
    return retryLater(controller, "server unreachable");
  }
  if (response.status === 401) {
    const sent = Object.keys(authHeaders()).length > 0;
    return askForKey(sent ? "That key was refused." : "");
  }
  if (!response.ok) return retryLater(controller, `HTTP ${response.status}`);
  setConnection("live", "live");
  try {
    await readEvents(response.body.getReader(), controller);
  } catch (error) {
    if (controller.signal.aborted) return;  // reconnect() replaced this stream
  }
  retryLater(controller, "stream ended");
}

async function readEvents(reader, controller) {
  const decoder = new TextDecoder();
  let buffer = "";
  while (!controller.signal.aborted) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      onEvent(event);
    }
  }
}

function onEvent(text) {
  let name = "message";
  let data = "";
  for (const line of text.split("\n")) {
    if (line.startsWith("event: ")) name = line.slice(7);
    else if (line.startsWith("data: ")) data += line.slice(6);
  }
  if (name === "end") {
    setConnection("engine stopped", "down");
    return;
  }
  if (data && !$("paused").checked) scheduleRender(JSON.parse(data));
}

// At most one render per frame, of the newest state: a slow page skips updates, never queues them.
let pendingState = null;
function scheduleRender(state) {
  if (pendingState === null) requestAnimationFrame(() => { const s = pendingState; pendingState = null; render(s); });
  pendingState = state;
}

function retryLater(controller, why) {
  if (controller.signal.aborted) return;
  setConnection(`${why}; retrying`, "down");
  setTimeout(() => { if (view.controller === controller) connect(); }, 1000);
}

function reconnect() {
  if (view.controller) view.controller.abort();
  connect();
}

// ---- rendering ---------------------------------------------------------------------------------------
function render(state) {
  if (state !== view.state) keepWhatTheEventLeftOut(state);
  view.state = state;
  view.updates += 1;
  document.body.dataset.updates = String(view.updates);
  const q = state.queues;
  $("num-running").textContent = q.num_running;
  $("num-waiting").textContent = q.num_waiting;
  $("num-swapped").textContent = q.num_swapped;
  const kv = state.kv;
  $("kv-usage").textContent = `${kv.num_used_blocks} / ${kv.num_blocks} (${percent(kv.usage)})`;
  $("preemptions").textContent = state.counters.num_preemptions;
  const c = state.counters;
  $("hit-rate").textContent = state.config.prefix_caching
    ? `${percent(c.prefix_cache_hit_rate)} (${c.prefix_cache_hits} / ${c.prefix_cache_queries} tokens)` : "off";
  renderQueues(q);
  renderSeries(state.series);
  renderBlocks(state);
}

// The stream sends the series when they changed and the block map about once a second: an
// event without them keeps the last ones (with the requests whose block ids came with that map).
function keepWhatTheEventLeftOut(state) {
  const last = view.state;
  if (state.series === undefined && last) state.series = last.series;
  if (state.blocks !== undefined) {
    state.mapQueues = state.queues;
  } else if (last && $("show-blocks").checked) {
    state.blocks = last.blocks;
    state.mapQueues = last.mapQueues;
  }
}

function percent(x) { return `${(100 * x).toFixed(1)}%`; }

function seconds(x) {
  if (x === null || x === undefined) return "–";
  return x < 1 ? `${(1000 * x).toFixed(1)} ms` : `${x.toFixed(2)} s`;
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = String(text);
  if (className) td.className = className;
  return td;
}

function fillTable(id, requests, columns) {
  const body = $(id).querySelector("tbody");
  const rows = requests.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.requestId = r.id;
    tr.append(cell(r.id, "id"), ...columns.map((f) => cell(f(r))));
    tr.title = r.id + (r.family ? ` (of ${r.family})` : "") + (r.lora ? `, adapter ${r.lora}` : "");
    if (view.hover && view.hover.has(r.id)) tr.className = "hot";
    return tr;
  });
  body.replaceChildren(...rows);
}

function renderQueues(q) {
  const age = (r) => `${r.age_s.toFixed(1)} s`;
  fillTable("running", q.running, [(r) => r.priority, (r) => r.prompt_tokens, (r) => r.output_tokens,
    (r) => r.cached_tokens, (r) => r.num_blocks, (r) => r.preemptions, age]);
  fillTable("waiting", q.waiting, [(r) => r.priority, (r) => r.status, (r) => r.wait_reason,
    (r) => r.prompt_tokens, (r) => r.output_tokens, age]);
  fillTable("swapped", q.swapped, [(r) => r.priority, (r) => r.wait_reason, (r) => r.computed_tokens,
    (r) => r.num_cpu_blocks, age]);
  const listed = (n, shown) => (n > shown ? `${n} (first ${shown} listed)` : String(n));
  $("running-count").textContent = listed(q.num_running, q.running.length);
  $("waiting-count").textContent = listed(q.num_waiting, q.waiting.length);
  $("swapped-count").textContent = listed(q.num_swapped, q.swapped.length);
}

// ---- sparklines ------------------------------------------------------------------------------------------
function renderSeries(series) {
  if (!series) return;
  sparkline($("spark-gen"), series.generation_tokens_per_s, "#31a354");
  sparkline($("spark-comp"), series.computed_tokens_per_s, "#3182bd");
  sparkline($("spark-ttft"), series.ttft_s, "#e6550d");
  sparkline($("spark-itl"), series.itl_s, "#756bb1");
  const last = (xs) => { for (let i = xs.length - 1; i >= Math.max(0, xs.length - 5); i--) if (xs[i] !== null) return xs[i]; return null; };
  $("gen-now").textContent = `${series.generation_tokens_per_s.at(-1)}/s`;
  $("comp-now").textContent = `${series.computed_tokens_per_s.at(-1)}/s`;
  $("ttft-now").textContent = seconds(last(series.ttft_s));
  $("itl-now").textContent = seconds(last(series.itl_s));
}

function sparkline(canvas, values, colour) {
  const g = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  g.clearRect(0, 0, w, h);
  const present = values.filter((v) => v !== null);
  const top = Math.max(...present, 0) || 1;
  g.strokeStyle = colour;
  g.lineWidth = 1.5;
  g.beginPath();
  let drawing = false;
  values.forEach((v, i) => {
    if (v === null) { drawing = false; return; }
    const x = (i / Math.max(1, values.length - 1)) * (w - 2) + 1;
    const y = h - 2 - (v / top) * (h - 6);
    if (drawing) g.lineTo(x, y); else g.moveTo(x, y);
    drawing = true;
  });
  g.stroke();
  g.fillStyle = "#999";
  g.font = "10px sans-serif";
  g.fillText(top < 1 ? seconds(top) : String(Math.round(top)), 2, 10);
}

// ---- the block map ----------------------------------------------------------------------------------------
function indexOwners(state) {
  view.owners = new Map();
  view.cpuOwners = new Map();
  const q = state.mapQueues;
  for (const r of [...q.running, ...q.waiting, ...q.swapped, ...q.parked]) {
    for (const b of r.block_ids || []) push(view.owners, b, r.id);
    for (const b of r.cpu_block_ids || []) push(view.cpuOwners, b, r.id);
  }
}

function push(map, key, value) {
  const list = map.get(key);
  if (list) list.push(value); else map.set(key, [value]);
}

function renderBlocks(state) {
  const map = $("block-map");
  if (!state.blocks || !$("show-blocks").checked) {
    map.hidden = true;
    $("blocks-summary").textContent = "(off)";
    return;
  }
  map.hidden = false;
  indexOwners(state);
  const device = decodeRuns(state.blocks.device);
  const counts = device.counts;
  map.dataset.used = String(counts.o + counts.s);
  map.dataset.shared = String(counts.s);
  $("blocks-summary").textContent =
    `${device.length} blocks of ${state.config.block_size} tokens: ${counts.o} owned, ${counts.s} shared, ` +
    `${counts.c} cached, ${counts.f} free`;
  drawMap(map, device, view.owners);
  const cpu = decodeRuns(state.blocks.cpu);
  $("cpu-map").hidden = $("cpu-title").hidden = cpu.length === 0;
  if (cpu.length) drawMap($("cpu-map"), cpu, view.cpuOwners);
}

// "o3f5" -> runs [["o", 3], ["f", 5]], 8 blocks (docs/dashboard.md: the block map).
function decodeRuns(encoded) {
  const runs = [];
  const counts = { f: 0, c: 0, o: 0, s: 0, w: 0 };
  let length = 0;
  for (const [, letter, count] of encoded.matchAll(/([fcosw])(\d+)/g)) {
    const n = Number(count);
    runs.push([letter, n]);
    counts[letter] += n;
    length += n;
  }
  return { runs, counts, length };
}

function stateAt(decoded, index) {
  let end = 0;
  for (const [letter, n] of decoded.runs) {
    end += n;
    if (index < end) return letter;
  }
  return null;
}

function layout(canvas, n) {
  const width = canvas.parentElement.clientWidth || 960;
  const maxHeight = MAX_MAP_HEIGHT[canvas.id];
  let size = Math.floor(Math.sqrt((width * maxHeight) / Math.max(1, n)));
  size = Math.max(1, Math.min(16, size));
  const cols = Math.max(1, Math.floor(width / size));
  const perCell = Math.max(1, Math.ceil(n / (cols * Math.floor(maxHeight / size))));
  return { size, cols, perCell, rows: Math.max(1, Math.ceil(n / perCell / cols)) };
}

// One pixel per cell in an ImageData (cheap for 100k+ blocks), scaled up to cells of `size`.
function drawMap(canvas, decoded, owners) {
  const { size, cols, rows, perCell } = layout(canvas, decoded.length);
  if (canvas.width !== cols * size || canvas.height !== rows * size) {
    canvas.width = cols * size;
    canvas.height = rows * size;
  }
  Object.assign(canvas.dataset, { size: String(size), cols: String(cols), perCell: String(perCell) });
  const image = new ImageData(cols, rows);
  const pixels = new Uint32Array(image.data.buffer);
  const starts = [];
  let start = 0;
  for (const [letter, n] of decoded.runs) { starts.push([letter, start, n]); start += n; }
  starts.sort((a, b) => PRECEDENCE.indexOf(a[0]) - PRECEDENCE.indexOf(b[0]));
  for (const [letter, first, n] of starts) {
    pixels.fill(PACKED[letter], Math.floor(first / perCell), Math.floor((first + n - 1) / perCell) + 1);
  }
  if ($("colour-by-request").checked) {
    for (const [block, ids] of owners) pixels[Math.floor(block / perCell)] = packedRequestColour(ids[0]);
  }
  if (view.hover) {
    const cells = Math.ceil(decoded.length / perCell);
    for (let p = 0; p < cells; p++) pixels[p] = (pixels[p] & 0x00ffffff) | 0x40000000;
    for (const [block, ids] of owners) {
      if (ids.some((id) => view.hover.has(id))) pixels[Math.floor(block / perCell)] |= 0xff000000;
    }
  }
  const scratch = new OffscreenCanvas(cols, rows);
  scratch.getContext("2d").putImageData(image, 0, 0);
  const g = canvas.getContext("2d");
  g.imageSmoothingEnabled = false;
  g.clearRect(0, 0, canvas.width, canvas.height);
  g.drawImage(scratch, 0, 0, cols * size, rows * size);
  if (size >= 6) drawGrid(g, size, cols, rows);
}

function drawGrid(g, size, cols, rows) {
  g.strokeStyle = "#fff";
  g.lineWidth = 1;
  g.beginPath();
  for (let x = 1; x < cols; x++) { g.moveTo(x * size + 0.5, 0); g.lineTo(x * size + 0.5, rows * size); }
  for (let y = 1; y < rows; y++) { g.moveTo(0, y * size + 0.5); g.lineTo(cols * size, y * size + 0.5); }
  g.stroke();
}

// Colours as little-endian RGBA words (what a Uint32Array over ImageData.data holds).
function pack(r, g, b) { return (0xff000000 | (b << 16) | (g << 8) | r) >>> 0; }
function packHex(hex) { const v = parseInt(hex.slice(1), 16); return pack(v >> 16, (v >> 8) & 255, v & 255); }
const PACKED = Object.fromEntries(Object.entries(COLOURS).map(([k, v]) => [k, packHex(v)]));

function packedRequestColour(id) {
  const [r, g, b] = hslToRgb(requestHue(id), 0.65, 0.5);
  return pack(r, g, b);
}

function hslToRgb(h, s, l) {
  const k = (n) => (n + h / 30) % 12;
  const a = s * Math.min(l, 1 - l);
  const f = (n) => Math.round(255 * (l - a * Math.max(-1, Math.min(k(n) - 3, 9 - k(n), 1))));
  return [f(0), f(8), f(4)];
}

function requestHue(id) {
  let h = 0;
  for (let i = 0; i < id.length; i++) h = (h * 31 + id.charCodeAt(i)) >>> 0;
  return h % 360;
}

function blockAt(canvas, event) {
  const rect = canvas.getBoundingClientRect();
  const size = Number(canvas.dataset.size), cols = Number(canvas.dataset.cols);
  const x = Math.floor((event.clientX - rect.left) / size), y = Math.floor((event.clientY - rect.top) / size);
  return x < cols ? (y * cols + x) * Number(canvas.dataset.perCell) : -1;
}

function hoverMap(canvas, event, kind) {
  const state = view.state;
  if (!state || !state.blocks) return;
  const decoded = decodeRuns(state.blocks[kind]);
  const i = blockAt(canvas, event);
  const tip = $("tooltip");
  if (i < 0 || i >= decoded.length) { leaveMap(); return; }
  const ids = (kind === "device" ? view.owners : view.cpuOwners).get(i) || [];
  const perCell = Number(canvas.dataset.perCell);
  const which = perCell > 1 ? `blocks ${i}-${Math.min(decoded.length, i + perCell) - 1}, first` : `block ${i}`;
  tip.textContent = `${kind === "cpu" ? "CPU " : ""}${which}: ${STATE_NAMES[stateAt(decoded, i)]}` +
    (ids.length ? `\n${ids.join("\n")}` : "");
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 12}px`;
  tip.hidden = false;
  highlight(ids.length ? new Set(ids) : null);
}

function leaveMap() {
  $("tooltip").hidden = true;
  highlight(null);
}

function highlight(ids) {
  const same = (a, b) => a === b || (a && b && a.size === b.size && [...a].every((x) => b.has(x)));
  if (same(ids, view.hover)) return;
  view.hover = ids;
  if (view.state) render(view.state);
  view.updates -= 1;  // a redraw, not an update
  document.body.dataset.updates = String(view.updates);
}

$("block-map").addEventListener("mousemove", (e) => hoverMap($("block-map"), e, "device"));
$("cpu-map").addEventListener("mousemove", (e) => hoverMap($("cpu-map"), e, "cpu"));
for (const id of ["block-map", "cpu-map"]) $(id).addEventListener("mouseleave", leaveMap);
$("queues").addEventListener("mouseover", (e) => {
  const row = e.target.closest("tr[data-request-id]");
  highlight(row ? new Set([row.dataset.requestId]) : null);
});
$("queues").addEventListener("mouseleave", () => highlight(null));
$("show-blocks").addEventListener("change", reconnect);
$("colour-by-request").addEventListener("change", () => { if (view.state) renderBlocks(view.state); });

takeKeyFromUrl();
connect();
