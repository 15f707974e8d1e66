// The GPT-2 head explorer: draws an exploration (max_gpt2/explorer/data.py) and asks the server for more.
// Maps arrive as base64 bytes, each weight round(255 w), row-major; they are drawn on canvases.
"use strict";

const settings = JSON.parse(document.getElementById("explorer-settings").textContent);
const $ = (id) => document.getElementById(id);
const KINDS = ["previous-token", "duplicate-token", "induction"];
const CELL = 44; // pixels a head's thumbnail takes in the model view
const LABEL = 28; // the model view's margin for layer and head numbers

const state = { summary: null, map: null, layer: 0, head: 0, hovered: null, thumbnails: null };

function bytes(base64) {
  const raw = atob(base64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

function status(message) { $("status").textContent = message; }

function showError(message) {
  $("error").hidden = !message;
  $("error").textContent = message || "";
}

async function ask(path, options) {
  const response = await fetch(settings.api + path, options);
  const body = await response.json().catch(() => ({ error: `the server answered ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `the server answered ${response.status}`);
  return body;
}

// Weight w (0..255) -> a colour from white to blue.
function paint(image, offset, w) {
  image.data[offset] = 255 - w;
  image.data[offset + 1] = 255 - Math.round(w * 0.6);
  image.data[offset + 2] = 255;
  image.data[offset + 3] = 255;
}

function drawMap(canvas, values, size) {
  canvas.width = size;
  canvas.height = size;
  const context = canvas.getContext("2d");
  const image = context.createImageData(size, size);
  for (let i = 0; i < size * size; i++) paint(image, 4 * i, values[i]);
  context.putImageData(image, 0, 0);
  return context;
}

function drawModelView() {
  const { layers, heads } = state.summary;
  const size = state.summary.thumbnails.size;
  const canvas = $("model-view");
  canvas.width = LABEL + heads * CELL;
  canvas.height = LABEL + layers * CELL;
  const context = canvas.getContext("2d");
  context.fillStyle = "white";
  context.fillRect(0, 0, canvas.width, canvas.height);
  context.imageSmoothingEnabled = false;
  const tile = document.createElement("canvas");
  const tileContext = drawMap(tile, new Uint8Array(size * size), size);
  const image = tileContext.createImageData(size, size);
  context.fillStyle = "#333";
  context.font = "11px sans-serif";
  for (let layer = 0; layer < layers; layer++) {
    context.fillText(String(layer), 4, LABEL + layer * CELL + CELL / 2 + 4);
    for (let head = 0; head < heads; head++) {
      const start = (layer * heads + head) * size * size;
      for (let i = 0; i < size * size; i++) paint(image, 4 * i, state.thumbnails[start + i]);
      tileContext.putImageData(image, 0, 0);
      context.drawImage(tile, LABEL + head * CELL + 1, LABEL + layer * CELL + 1, CELL - 2, CELL - 2);
    }
  }
  for (let head = 0; head < heads; head++) context.fillText(String(head), LABEL + head * CELL + CELL / 2 - 4, 16);
  context.strokeStyle = "#d00";
  context.lineWidth = 2;
  if (state.head !== null) context.strokeRect(LABEL + state.head * CELL, LABEL + state.layer * CELL, CELL, CELL);
}

function label(layer, head) {
  const scores = KINDS.map((kind) => `${kind} ${state.summary.scores[kind][layer][head].toFixed(2)}`);
  return `layer ${layer} head ${head}: ${scores.join(", ")}`;
}

async function openHead(layer, head) {
  state.layer = layer;
  state.head = head;
  $("layer").value = String(layer);
  $("head").value = head === null ? "mean" : String(head);
  $("head-label").textContent = head === null ? `layer ${layer}: the mean of its ${state.summary.heads} heads` : label(layer, head);
  drawModelView();
  const length = state.summary.tokens.length;
  if (state.summary.maps) {
    state.map = layerMap(layer, head, length);
  } else {
    const query = `?id=${state.summary.id}&layer=${layer}&head=${head === null ? "" : head}`;
    state.map = bytes((await ask("/api/map" + query)).data);
  }
  drawHeadView();
}

// A head's map from the embedded maps (a standalone page), or the mean of a layer's.
function layerMap(layer, head, length) {
  const all = state.embeddedMaps;
  const area = length * length;
  const heads = head === null ? [...Array(state.summary.heads).keys()] : [head];
  const out = new Uint8Array(area);
  for (let i = 0; i < area; i++) {
    let sum = 0;
    for (const h of heads) sum += all[(layer * state.summary.heads + h) * area + i];
    out[i] = Math.round(sum / heads.length);
  }
  return out;
}

function drawHeadView() {
  const length = state.summary.tokens.length;
  const context = drawMap($("head-map"), state.map, length);
  const row = state.hovered;
  if (row !== null) {
    context.fillStyle = "rgba(255, 0, 0, 0.35)";
    context.fillRect(0, row, length, 1); // where the hovered token attends
    context.fillStyle = "rgba(255, 150, 40, 0.35)";
    context.fillRect(row, 0, 1, length); // what attends to it
  }
  colourTokens();
}

function colourTokens() {
  const length = state.summary.tokens.length;
  const row = state.hovered;
  for (const span of $("tokens").children) {
    const j = Number(span.dataset.index);
    span.classList.toggle("hovered", j === row);
    if (row === null || !state.map) { span.style.background = ""; continue; }
    const out = state.map[row * length + j] / 255; // the hovered token's weight on token j
    const into = state.map[j * length + row] / 255; // token j's weight on the hovered token
    span.style.background = out >= into
      ? `rgba(90, 140, 255, ${out.toFixed(3)})`
      : `rgba(255, 150, 40, ${into.toFixed(3)})`;
  }
}

function hover(index) {
  state.hovered = index;
  const tokens = state.summary.tokens;
  if (index !== null) {
    const p = state.summary.probabilities[index];
    const choices = (state.summary.alternatives[index] || []).map((a) => `${JSON.stringify(a.text)} ${a.p.toFixed(3)}`);
    $("token-info").textContent = `#${index} ${JSON.stringify(tokens[index].text)}` +
      (p === null ? " (first: nothing before it)" : ` p=${p.toFixed(4)}; likeliest there: ${choices.join(", ")}`);
  }
  if (state.map) drawHeadView();
}

function showTokens() {
  const box = $("tokens");
  box.replaceChildren();
  state.summary.tokens.forEach((token, index) => {
    const span = document.createElement("span");
    span.className = "token";
    span.dataset.index = String(index);
    span.textContent = token.text;
    span.addEventListener("mouseenter", () => hover(index));
    box.appendChild(span);
  });
}

function showProbabilities() {
  const body = $("probabilities").tBodies[0];
  body.replaceChildren();
  const { tokens, probabilities, alternatives } = state.summary;
  tokens.forEach((token, index) => {
    const row = body.insertRow();
    const p = probabilities[index];
    const there = (alternatives[index] || []).map((a) => `${JSON.stringify(a.text)} ${a.p.toFixed(3)}`).join("  ");
    for (const [text, mono] of [[String(index), false], [JSON.stringify(token.text), true], [p === null ? "" : p.toFixed(4), false], [there, true]]) {
      const cell = row.insertCell();
      cell.textContent = text;
      if (mono) cell.className = "mono";
    }
  });
}

function showRankings() {
  const box = $("rankings");
  box.replaceChildren();
  for (const kind of KINDS) {
    const column = document.createElement("div");
    const title = document.createElement("strong");
    title.textContent = kind === "induction" ? "likely induction heads" : `likely ${kind} heads`;
    const list = document.createElement("ol");
    list.className = `ranking ${kind}`;
    for (const [layer, head, score] of state.summary.ranking[kind]) {
      const item = document.createElement("li");
      item.textContent = `layer ${layer} head ${head}: ${score.toFixed(3)}`;
      item.addEventListener("click", () => openHead(layer, head).catch(failed));
      list.appendChild(item);
    }
    column.append(title, list);
    box.appendChild(column);
  }
}

function fillSelects() {
  const options = (select, values) => {
    select.replaceChildren(...values.map(([value, text]) => new Option(text, value)));
  };
  options($("layer"), [...Array(state.summary.layers).keys()].map((l) => [String(l), String(l)]));
  options($("head"), [["mean", "mean of the layer"], ...[...Array(state.summary.heads).keys()].map((h) => [String(h), String(h)])]);
}

async function show(summary) {
  state.summary = summary;
  state.thumbnails = bytes(summary.thumbnails.data);
  state.embeddedMaps = summary.maps ? bytes(summary.maps.data) : null;
  state.hovered = null;
  $("results").hidden = false;
  showTokens();
  showProbabilities();
  showRankings();
  fillSelects();
  const [layer, head] = summary.ranking.induction[0];
  await openHead(layer, head);
  status(`${summary.tokens.length} tokens, ${summary.layers} layers of ${summary.heads} heads`);
}

function failed(error) {
  status("");
  showError(error.message || String(error));
}

function number(id) {
  const value = $(id).value;
  return value === "" ? null : Number(value);
}

async function exploreText(text) {
  return exploreWith({
    text,
    new_tokens: number("new-tokens") || 0,
    temperature: number("temperature") || 0,
    top_k: number("top-k"),
    top_p: number("top-p"),
    seed: number("seed"),
  });
}

async function exploreWith(request) {
  showError("");
  status("running the model...");
  const summary = await ask("/api/explore", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(request),
  });
  $("text").value = summary.text; // with the continuation, or the example, in it
  await show(summary);
}

function download(name, url) {
  window.lastExport = { name, url }; // what the last export made, for anyone checking
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.appendChild(link);
  link.click();
  link.remove();
}

function exportPng() {
  const head = state.head === null ? "mean" : state.head;
  download(`head-${state.layer}-${head}.png`, $("head-map").toDataURL("image/png"));
}

function exportJson() {
  const data = { ...state.summary, open: { layer: state.layer, head: state.head, size: state.summary.tokens.length } };
  const url = URL.createObjectURL(new Blob([JSON.stringify(data)], { type: "application/json" }));
  download("exploration.json", url);
}

function induction() {
  // A random run of tokens, then the same again (the server draws it): induction heads look from
  // each token of the second run to the token after its first copy.
  return exploreWith({ example: "induction" });
}

function pointedCell(event) {
  const canvas = $("model-view");
  const box = canvas.getBoundingClientRect();
  const x = (event.clientX - box.left) * canvas.width / box.width - LABEL;
  const y = (event.clientY - box.top) * canvas.height / box.height - LABEL;
  if (x < 0 || y < 0) return null;
  const head = Math.floor(x / CELL);
  const layer = Math.floor(y / CELL);
  return layer < state.summary.layers && head < state.summary.heads ? [layer, head] : null;
}

function start() {
  $("explore").addEventListener("click", () => exploreText($("text").value).catch(failed));
  $("example").addEventListener("click", () => induction().catch(failed));
  $("model-view").addEventListener("click", (event) => {
    const cell = pointedCell(event);
    if (cell) openHead(...cell).catch(failed);
  });
  $("head-map").addEventListener("mousemove", (event) => {
    const canvas = $("head-map");
    const box = canvas.getBoundingClientRect();
    const row = Math.floor((event.clientY - box.top) * canvas.height / box.height);
    if (row >= 0 && row < state.summary.tokens.length && row !== state.hovered) hover(row);
  });
  const reopen = () => {
    const head = $("head").value === "mean" ? null : Number($("head").value);
    openHead(Number($("layer").value), head).catch(failed);
  };
  $("layer").addEventListener("change", reopen);
  $("head").addEventListener("change", reopen);
  $("export-png").addEventListener("click", exportPng);
  $("export-json").addEventListener("click", exportJson);
  if (!settings.textInput) $("text").placeholder = "This checkpoint has no tokenizer: type token ids, such as 464, 3290";
  if (settings.data) {
    // A standalone page: one text, no server.
    $("input").hidden = true;
    show(settings.data).catch(failed);
  } else {
    status("type or paste text, then Explore");
  }
}

start();
