// specdec playground: a chat client of this server's OpenAI-compatible API that colours each streamed
// token by its draft source (the chunk's `specdec.source`, asked for with `specdec.sources: true`) and
// counts tokens per forward pass and MAT as the chunks arrive. Nothing here is fetched from elsewhere.
"use strict";

const SOURCES = {
  target: "target (no draft accepted)", pld: "prompt lookup", root: "retrieval: next token",
  cand: "next-next retrieval (LogitSpec)", third: "third-level retrieval", recycle: "recycling",
  session: "session store", datastore: "datastore", draft: "draft model", layerskip: "layer-skip self-draft",
  head: "trained head", retrieval: "retrieval", lookahead: "lookahead (Jacobi)",
};
const KEY_STORE = "specdec-api-key";
const state = { key: sessionStorage.getItem(KEY_STORE) || "", methods: [], byName: {}, history: [], controllers: [] };
const $ = (id) => document.getElementById(id);

class KeyNeeded extends Error {}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.key) h.Authorization = "Bearer " + state.key;
  return h;
}

async function api(path, init = {}) {
  const response = await fetch(path, { ...init, headers: headers() });
  if (response.status === 401) {
    const body = await response.json().catch(() => ({}));
    askForKey(body.error ? body.error.message : "this server needs an API key");
    throw new KeyNeeded("API key needed");
  }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.error ? body.error.message : `HTTP ${response.status}`);
  }
  return response;
}

function askForKey(message) {
  $("key-form").hidden = false;
  $("key-note").textContent = message;
  $("key").focus();
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// ------------------------------------------------------------------ methods and their options
async function loadServer() {
  try {
    const models = await (await api("/v1/models")).json();
    $("model").textContent = models.data.map((m) => m.id).join(", ");
    const listing = await (await api("/v1/specdec/methods")).json();
    state.methods = listing.data;
    state.byName = Object.fromEntries(listing.data.map((m) => [m.name, m]));
    fillMethods(listing.default);
    $("key-form").hidden = !state.key;
    $("key-note").textContent = state.key ? "key accepted" : "";
    setStatus("ready");
  } catch (error) {
    if (!(error instanceof KeyNeeded)) setStatus("could not reach the server: " + error.message);
  }
}

function fillMethods(defaultName) {
  const select = $("method");
  select.replaceChildren();
  for (const method of state.methods) {
    const option = element("option", "", method.available ? method.name : `${method.name} (not on this server)`);
    option.value = method.name;
    option.disabled = !method.available;
    if (!method.available) option.title = method.reason;
    select.append(option);
  }
  select.value = defaultName;
  showOptions();
}

function showOptions() {
  const method = state.byName[$("method").value];
  const box = $("options");
  box.replaceChildren(element("legend", "", "Options"));
  for (const spec of method ? method.options : []) box.append(optionInput(spec));
  box.classList.toggle("none", !method || method.options.length === 0);
  $("method-note").textContent = method && method.options.length === 0 ? "no options a request may set" : "";
}

function optionInput(spec) {
  const label = element("label", spec.kind === "bool" ? "bool" : "");
  label.title = spec.describe;
  let input;
  if (spec.choices.length) {
    input = element("select");
    for (const choice of spec.choices) input.append(new Option(choice, choice));
    input.value = spec.value;
  } else if (spec.kind === "bool") {
    input = element("input");
    input.type = "checkbox";
    input.checked = spec.value;
  } else {
    input = element("input");
    input.type = spec.kind === "str" ? "text" : "number";
    if (spec.kind === "int") input.step = "1";
    if (spec.kind === "float") input.step = "any";
    if (spec.min !== null) input.min = spec.min;
    if (spec.max !== null) input.max = spec.max;
    input.value = spec.value;
  }
  input.dataset.option = spec.name;
  input.dataset.kind = spec.kind;
  input.dataset.initial = String(spec.value);
  if (spec.kind === "bool") label.append(input, spec.name);
  else label.append(spec.name, input);
  return label;
}

function chosenOptions() {
  const options = {};
  for (const input of $("options").querySelectorAll("[data-option]")) {
    const kind = input.dataset.kind;
    const value = kind === "bool" ? input.checked : kind === "int" || kind === "float" ? Number(input.value) : input.value;
    if (String(value) !== input.dataset.initial) options[input.dataset.option] = value;
  }
  return options;
}

function showLegend() {
  const legend = $("legend");
  for (const [source, label] of Object.entries(SOURCES)) {
    const item = element("span", "src-" + source, label);
    item.dataset.source = source;
    legend.append(item);
  }
}

// ------------------------------------------------------------------ one streamed reply
class Pane {
  constructor(method, parent) {
    this.root = element("div", "reply");
    this.root.dataset.method = method;
    const head = element("div", "reply-head");
    head.append(element("span", "", method), (this.state = element("span", "muted", "waiting")));
    this.text = element("div", "reply-text");
    this.counters = element("div", "counters");
    this.root.append(head, this.text, this.counters);
    parent.append(this.root);
    this.content = "";
    this.tokens = 0;
    this.passes = 0;
    this.lastPass = 0;
    this.previousEnd = -1;
    this.firstAt = null;
    this.started = performance.now();
    this.render();
  }

  add(text, tag) {
    const source = tag ? tag.source : "target";
    const span = element("span", "tok src-" + (source in SOURCES ? source : "other"), text);
    if (tag) {
      span.dataset.source = tag.source;
      span.dataset.step = tag.step;
      span.title = `${SOURCES[tag.source] || tag.source} · pass ${tag.step}`;
      if (tag.step !== this.passes) span.classList.add("pass-start"); // a thin bar between passes
      this.count(tag);
    }
    this.text.append(span);
    this.content += text;
    if (this.firstAt === null) this.firstAt = performance.now();
    this.state.textContent = "streaming";
    this.render();
  }

  // tokens per pass: a piece's token index less the last index of the pass before (pass 0: the prefill)
  count(tag) {
    if (tag.step !== this.passes) this.previousEnd = this.tokens - 1;
    this.tokens = tag.token + 1;
    this.passes = tag.step;
    this.lastPass = tag.step > 0 ? tag.token - this.previousEnd : 0;
  }

  render() {
    const now = performance.now();
    const seconds = (now - this.started) / 1000;
    const mat = this.passes > 0 ? ((this.tokens - 1) / this.passes).toFixed(2) : "–";
    const values = {
      tokens: this.tokens, passes: this.passes, "last pass": this.lastPass ? `${this.lastPass} tok` : "–", MAT: mat,
      "first token": this.firstAt === null ? "–" : `${Math.round(this.firstAt - this.started)} ms`,
      "tok/s": seconds > 0 ? (this.tokens / seconds).toFixed(1) : "–", time: `${seconds.toFixed(2)} s`,
    };
    this.counters.replaceChildren();
    for (const [name, value] of Object.entries(values)) {
      const item = element("span", "counter");
      item.dataset.counter = name;
      item.append(name + " ", element("b", "", String(value)));
      this.counters.append(item);
    }
  }

  finish(reason) {
    this.state.textContent = reason === "stop" || reason === "length" ? `finished (${reason})` : reason;
    this.root.dataset.done = "true";
    this.render();
  }

  fail(message) {
    this.root.classList.add("error");
    this.text.append(element("span", "", message));
    this.finish("error");
  }
}

async function stream(body, pane, signal) {
  const response = await api("/v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        if (line === "data: [DONE]") return;
        handleChunk(JSON.parse(line.slice(6)), pane);
      }
    }
  }
}

function handleChunk(chunk, pane) {
  if (chunk.error) throw new Error(chunk.error.message);
  const choice = chunk.choices && chunk.choices[0];
  if (!choice) return;
  const text = choice.delta && choice.delta.content;
  if (text) pane.add(text, chunk.specdec && chunk.specdec.source ? chunk.specdec : null);
  if (choice.finish_reason) pane.finishReason = choice.finish_reason;
}

function requestBody(method, options, messages) {
  return {
    messages, stream: true, max_tokens: Number($("max-tokens").value) || 128,
    temperature: Number($("temperature").value) || 0,
    specdec: { method, options, sources: true },
  };
}

async function run(body, pane) {
  const controller = new AbortController();
  state.controllers.push(controller);
  try {
    await stream(body, pane, controller.signal);
    pane.finish(pane.finishReason || "done");
  } catch (error) {
    if (controller.signal.aborted) pane.finish("stopped");
    else pane.fail(error instanceof KeyNeeded ? "an API key is needed (above)" : error.message);
  }
}

// ------------------------------------------------------------------ the conversation
async function send(event) {
  event.preventDefault();
  const prompt = $("prompt").value.trim();
  if (!prompt || state.controllers.length) return;
  const method = $("method").value;
  const messages = [...state.history, { role: "user", content: prompt }];
  const turn = element("div", "turn");
  const replies = element("div", "replies");
  turn.append(element("div", "user", prompt), replies);
  $("log").append(turn);
  $("prompt").value = "";
  const main = new Pane(method, replies);
  const runs = [run(requestBody(method, chosenOptions(), messages), main)];
  if ($("compare").checked && method !== "plain") runs.push(run(requestBody("plain", {}, messages), new Pane("plain", replies)));
  busy(true);
  await Promise.all(runs);
  busy(false);
  state.history = [...messages, { role: "assistant", content: main.content }];
}

function busy(on) {
  if (!on) state.controllers = [];
  $("send").disabled = on;
  $("stop").disabled = !on;
  setStatus(on ? "generating" : "ready");
}

function setStatus(text) {
  $("status").textContent = text;
}

function start() {
  showLegend();
  $("method").addEventListener("change", showOptions);
  $("ask").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) send(event);
  });
  $("stop").addEventListener("click", () => state.controllers.forEach((c) => c.abort()));
  $("clear").addEventListener("click", () => {
    state.history = [];
    $("log").replaceChildren();
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("key").value.trim();
    sessionStorage.setItem(KEY_STORE, state.key);
    loadServer();
  });
  loadServer();
}

document.addEventListener("DOMContentLoaded", start);
