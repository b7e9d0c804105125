// The web page of `tightkv serve`: documents (add, follow the load, reopen) and a chat that
// asks about the open document through /v1/documents, or talks to the model through
// /v1/chat/completions. Plain JavaScript, no build step, nothing fetched but our own routes.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = "tightkv.apiKey";
const md = () => window.tightkvMarkdown;

const state = {
  current: null,        // the open document's record
  text: "",             // its text (the quoted spans index it)
  chat: [],             // the conversation with the model when no document is open
  model: "",            // the served model's id
  chatTemplate: null,   // whether it has a chat template (false: a base model; null: not known yet)
  plain: "",            // a base model's conversation so far, as the text it continues
  busy: false,
};

// A model without a chat template (a base model, such as the embedded Gemma 3 270M) does not
// answer a chat: it continues text. Its chat is a completion-style prompt, the conversation as
// "Question: ...\nAnswer:" lines, continued through /v1/completions up to the next question,
// greedy with llama-cli's old repeat penalty, as `tightkv run` gives a base model
// (engine.chat.BASE_REPEAT_PENALTY), so it does not loop on one sentence.
const BASE_REPEAT_PENALTY = 1.1;
const PLAIN_TOKENS = 128;
const PLAIN_STOP = "\nQuestion:";
const TALK = "Pick or add a document to ask about it.";

// --- HTTP ------------------------------------------------------------------------------------
class RequestError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

function apiKey() { return sessionStorage.getItem(KEY) || ""; }

async function api(path, options = {}, retried = false) {
  const headers = Object.assign({}, options.headers || {});
  if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
  let response;
  try {
    response = await fetch(path, Object.assign({}, options, { headers }));
  } catch (err) {
    throw new RequestError("The server cannot be reached: is `tightkv serve` still running?", 0);
  }
  if (response.status === 401 && !retried) {
    await askForKey(apiKey() ? "That key was refused; enter the server's API key." : "");
    return api(path, options, true);
  }
  if (!response.ok) throw new RequestError(await errorMessage(response), response.status);
  return response;
}

async function errorMessage(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    const err = body.error;
    message = typeof err === "string" ? err : (err && err.message) || message;
  } catch (_) { /* not JSON: keep the status line */ }
  if (response.status === 503) {
    const wait = response.headers.get("Retry-After");
    message += wait ? ` (try again in ${wait} s)` : " (try again shortly)";
  }
  return message;
}

const json = (body) => ({ method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });

// Read an SSE body (`data: ...` events); call onEvent with each JSON payload until [DONE].
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const chunk = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of chunk.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

// --- the API key ------------------------------------------------------------------------------
function askForKey(why) {
  const dialog = $("key-dialog");
  $("key-error").textContent = why || "";
  $("key").value = "";
  return new Promise((resolve) => {
    const form = $("key-form");
    const done = (event) => {
      event.preventDefault();
      const key = $("key").value.trim();
      if (!key) { $("key-error").textContent = "Enter the key first."; return; }
      sessionStorage.setItem(KEY, key);
      form.removeEventListener("submit", done);
      dialog.close();
      resolve();
    };
    form.addEventListener("submit", done);
    if (!dialog.open) dialog.showModal();
    $("key").focus();
  });
}

// --- small helpers -----------------------------------------------------------------------------
const number = (n) => (n == null ? "?" : Number(n).toLocaleString("en-US"));

function bytes(n) {
  if (n == null) return "?";
  const units = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function seconds(s) {
  if (s == null) return "?";
  if (s < 60) return `${Math.round(s)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

const MODE_NAMES = { full: "full", rlv: "RLV", rag: "RAG", auto: "auto" };

function sourceText(doc) {
  switch (doc.source) {
    case "disk": return "warm from the store";
    case "ram": return "warm (already open)";
    case "prefill": return "prefilled now, saved to the store";
    case "reads": return "RLV: read in parts, reads kept in the store";
    default: return "";
  }
}

// An error about a named document, its name said once.
const about = (name, message) => (message.startsWith(name) ? message : `${name}: ${message}`);

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

function el(tag, props = {}, text) {
  const node = document.createElement(tag);
  Object.assign(node, props);
  if (text != null) node.textContent = text;
  return node;
}

// --- the document list ---------------------------------------------------------------------------
async function refreshList() {
  const response = await api("/v1/documents");
  const { data } = await response.json();
  const list = $("doc-list");
  list.replaceChildren();
  if (!data.length) list.append(el("li", { className: "muted small" }, "No documents yet."));
  for (const doc of data) {
    const item = el("li", { className: "doc-item" });
    const button = el("button", { type: "button", className: "doc-button" }, doc.name);
    button.dataset.id = doc.id;
    button.setAttribute("aria-pressed", String(state.current && state.current.id === doc.id));
    button.addEventListener("click", () => openDocument(doc.id, doc.name));
    const facts = [];
    if (doc.tokens) facts.push(`${number(doc.tokens)} tokens`);
    if (doc.kv) facts.push(`KV ${doc.kv}${doc.kv_bytes ? ` ${bytes(doc.kv_bytes)}` : ""}`);
    facts.push(doc.status === "loaded" ? "open" : doc.cached ? "cached: opens warm" : doc.status);
    item.append(button, el("span", { className: "doc-meta small" }, facts.join(" · ")));
    list.append(item);
  }
}

// --- loading a document ------------------------------------------------------------------------
function showLoad(name, event) {
  $("load").hidden = false;
  $("load-name").textContent = name;
  const bar = $("load-bar");
  if (event && event.type === "progress") {
    bar.max = event.total || 1;
    bar.value = event.done || 0;
    const parts = [`${number(event.done)} of ${number(event.total)} tokens`];
    if (event.rate) parts.push(`${number(Math.round(event.rate))} tokens/s`);
    if (event.eta_s != null) parts.push(`${seconds(event.eta_s)} left`);
    $("load-text").textContent = `Prefill: ${parts.join(" · ")}`;
  } else {
    bar.removeAttribute("value");  // indeterminate until the first chunk
    $("load-text").textContent = event && event.status === "queued" ? "Waiting for the model…" : "Reading…";
  }
}

// Follow a document's load (SSE) until it is loaded (resolves with its record) or fails (throws).
async function followLoad(id, name) {
  showLoad(name);
  const response = await api(`/v1/documents/${id}/events`);
  let result = null, failure = null;
  await readEvents(response, (event) => {
    if (event.type === "progress" || event.type === "status") showLoad(name, event);
    else if (event.type === "loaded") result = event.document;
    else if (event.type === "error") failure = event.error.message;
  });
  $("load").hidden = true;
  if (failure) throw new RequestError(failure, 400);
  if (!result) throw new RequestError(`${name} did not load (see GET /v1/documents/${id})`, 0);
  return result;
}

async function afterUpload(response, name) {
  const record = await response.json();
  await refreshList();
  const doc = record.status === "loaded" ? record : await followLoad(record.id, name);
  await showDocument(doc);
}

async function uploadFile(file) {
  if (!file) return;
  showError("");
  const form = new FormData();
  form.append("file", file, file.name);
  form.append("mode", $("mode").value);
  try {
    showLoad(file.name);
    await afterUpload(await api("/v1/documents", { method: "POST", body: form }), file.name);
  } catch (err) {
    $("load").hidden = true;
    showError(about(file.name, err.message));
  } finally {
    refreshList().catch(() => {});
  }
}

async function addTextAsDocument() {
  const box = $("message");
  const text = box.value;
  if (!text.trim()) {
    showError("Paste or type the document's text into the message box first, then press Add as document.");
    box.focus();
    return;
  }
  showError("");
  const name = text.trim().split("\n")[0].replace(/^#+\s*/, "").slice(0, 60) || "pasted text";
  try {
    showLoad(name);
    const response = await api("/v1/documents", json({ text, name, mode: $("mode").value }));
    await afterUpload(response, name);
    if (box.value === text) box.value = "";  // loaded: the text is the open document now
  } catch (err) {
    $("load").hidden = true;
    showError(about(name, err.message));
  } finally {
    refreshList().catch(() => {});
  }
}

async function openDocument(id, name) {
  showError("");
  try {
    const response = await api(`/v1/documents/${id}/open`, json({ mode: $("mode").value }));
    await afterUpload(response, name);
  } catch (err) {
    $("load").hidden = true;
    showError(about(name, err.message));
  }
}

async function showDocument(doc) {
  state.current = doc;
  const response = await api(`/v1/documents/${doc.id}/text`);
  state.text = (await response.json()).text;
  const facts = [`${number(doc.tokens)} tokens`, `mode ${MODE_NAMES[doc.mode] || doc.mode}`];
  if (doc.mode === "full") facts.push(`KV ${doc.kv}, ${bytes(doc.kv_bytes)}`);
  else facts.push(`KV ${doc.kv}`);
  const source = sourceText(doc);
  if (source) facts.push(source);
  if (doc.seconds != null) facts.push(`${doc.seconds < 1 ? doc.seconds.toFixed(2) : Math.round(doc.seconds)} s`);
  $("view-meta").textContent = `${doc.name}: ${facts.join(" · ")}`;
  $("view-meta").dataset.source = doc.source || "";
  $("target").textContent = `Asking about ${doc.name} (${MODE_NAMES[doc.mode] || doc.mode} mode, ${source || "loaded"}).`;
  $("to-chat").hidden = false;
  renderText([]);
  for (const button of document.querySelectorAll(".doc-button")) {
    button.setAttribute("aria-pressed", String(button.dataset.id === doc.id));
  }
  $("message").focus();
}

function leaveDocument() {
  state.current = null;
  state.text = "";
  $("target").textContent = chatTarget();
  $("view-meta").textContent = "No document open.";
  $("view").replaceChildren();
  $("to-chat").hidden = true;
  for (const button of document.querySelectorAll(".doc-button")) button.setAttribute("aria-pressed", "false");
}

// The document's text with the quoted spans marked (text nodes only: nothing is parsed as HTML),
// block by block (textBlocks): a paragraph's hard line breaks read as spaces, code kept as it is.
function renderText(quotes, answer) {
  const view = $("view");
  view.replaceChildren();
  const spans = [];
  [...quotes].sort((a, b) => a.start - b.start).forEach((q, i) => {
    if (!spans.length || q.start >= spans[spans.length - 1].end) spans.push({ ...q, id: `quote-${i}` });
  });
  for (const block of textBlocks(state.text)) {
    const node = el(block.kind === "pre" ? "pre" : "p", { className: block.kind === "pre" ? "doc-pre" : "doc-para" });
    let at = block.start;
    for (const q of spans) {
      const start = Math.max(q.start, block.start), end = Math.min(q.end, block.end);
      if (start >= end) continue;
      node.append(document.createTextNode(state.text.slice(at, start)));
      const mark = el("mark", { className: "quote" }, state.text.slice(start, end));
      if (start === q.start) mark.id = q.id;  // a quote over two blocks: its first part is the anchor
      if (answer && holds(q.text, answer)) mark.classList.add("holds-answer");
      node.append(mark);
      at = end;
    }
    node.append(document.createTextNode(state.text.slice(at, block.end)));
    view.append(node);
  }
  const first = view.querySelector("mark.holds-answer") || view.querySelector("mark");
  if (first) first.scrollIntoView({ block: "center" });
}

// The text's blocks as [start, end) offsets into it, kind "p" or "pre": blank lines end a
// paragraph; a heading, a list item or a quoted line starts one; fenced code (``` or ~~~),
// indented code after a blank line, and table rows are "pre", their lines kept.
function textBlocks(text) {
  const blocks = [];
  let open = null, fence = null;
  const start = (kind, at, end) => { open = { kind, start: at, end }; blocks.push(open); };
  for (let at = 0; at <= text.length; ) {
    const nl = text.indexOf("\n", at);
    const end = nl < 0 ? text.length : nl;
    const line = text.slice(at, end);
    const fenceMark = (line.match(/^\s*(```|~~~)/) || [])[1];
    if (fence) {
      open.end = end;
      if (fenceMark === fence) fence = open = null;
    } else if (fenceMark) {
      start("pre", at, end);
      fence = fenceMark;
    } else if (!line.trim()) {
      open = null;
    } else if ((/^(\t| {4})/.test(line) && (!open || open.kind === "pre")) || /^\s*\|/.test(line)) {
      if (open && open.kind === "pre") open.end = end;
      else start("pre", at, end);
    } else if (open && open.kind === "p" && !/^\s*(#{1,6}\s|[-*+]\s|\d+[.)]\s|>)/.test(line)) {
      open.end = end;
    } else {
      start("p", at, end);
      if (/^\s*#{1,6}\s/.test(line)) open = null;  // a heading is a line of its own
    }
    if (nl < 0) break;
    at = nl + 1;
  }
  return blocks;
}

// Whether a quoted sentence holds the answer's words (most of its longer ones).
function holds(sentence, answer) {
  const words = (answer.toLowerCase().match(/[\p{L}\p{N}]{3,}/gu) || []);
  if (!words.length) return false;
  const s = sentence.toLowerCase();
  return words.filter((w) => s.includes(w)).length / words.length >= 0.6;
}

// --- the conversation ------------------------------------------------------------------------------
function addMessage(role, text) {
  const item = el("li", { className: `msg ${role}` });
  item.append(el("span", { className: "visually-hidden" }, role === "user" ? "You: " : "Answer: "));
  const body = el("div", { className: "body" });
  if (text != null) body.textContent = text;
  item.append(body);
  $("log").append(item);
  item.scrollIntoView({ block: "end" });
  return item;
}

function setBusy(busy) {
  state.busy = busy;
  $("send").disabled = busy;
  $("composer").setAttribute("aria-busy", String(busy));
}

async function send() {
  const box = $("message");
  const text = box.value;
  if (!text.trim() || state.busy) return;
  showError("");
  box.value = "";
  addMessage("user", text);
  const reply = addMessage("assistant");
  reply.classList.add("pending");
  setBusy(true);
  try {
    if (state.current) await askDocument(text, reply);
    else await chat(text, reply);
  } catch (err) {
    reply.classList.add("failed");
    reply.querySelector(".body").textContent = err.message;
    showError(err.message);
    if (!box.value.trim()) box.value = text;  // nothing typed is lost: the question is back in the box
    else box.value = `${text}\n${box.value}`;
  } finally {
    reply.classList.remove("pending");
    setBusy(false);
    box.focus();
  }
}

async function askDocument(question, reply) {
  const doc = state.current;
  const body = reply.querySelector(".body");
  const status = el("p", { className: "status small" });
  reply.append(status);
  const response = await api(`/v1/documents/${doc.id}/ask`, json({ question, stream: true }));
  let streamed = "", answer = null, failure = null;
  await readEvents(response, (event) => {
    if (event.type === "progress") showLoad(doc.name, event);
    else if (event.type === "loaded") $("load").hidden = true;
    else if (event.type === "read") {
      streamed = "";
      body.textContent = "";
      status.textContent = `RLV read ${event.read}: ${event.sections.join(" + ") || "the quoted sentences"}…`;
    } else if (event.type === "delta") {
      streamed += event.text;
      body.textContent = streamed.trimStart();
    } else if (event.type === "answer") answer = event;
    else if (event.type === "error") failure = event.error.message;
  });
  $("load").hidden = true;
  if (failure) throw new RequestError(failure, 400);
  if (!answer) throw new RequestError("the answer stopped before it was complete", 0);
  body.innerHTML = md().renderMarkdown(answer.answer || "(no answer)");
  status.textContent = "";
  const facts = [`mode ${MODE_NAMES[answer.mode] || answer.mode}`];
  if (answer.citation) facts.push(answer.citation);
  if (answer.verified === false) facts.push("not verified");
  facts.push(`${answer.seconds.toFixed(1)} s`);
  reply.append(el("p", { className: "meta small" }, facts.join(" · ")));
  if (answer.quotes.length) reply.append(quoteList(answer));
  reply.scrollIntoView({ block: "end" });
  renderText(answer.quotes, answer.answer);
}

function quoteList(answer) {
  const box = el("details", { className: "quotes", open: true });
  box.append(el("summary", {}, `Quoted evidence (${answer.quotes.length})`));
  const list = el("ol");
  const sorted = [...answer.quotes].sort((a, b) => a.start - b.start);
  sorted.forEach((q, i) => {
    const item = el("li");
    const link = el("button", { type: "button", className: "link" }, q.text);
    if (holds(q.text, answer.answer)) link.classList.add("holds-answer");
    link.addEventListener("click", () => {
      renderText(answer.quotes, answer.answer);
      const mark = $(`quote-${i}`);
      if (mark) { mark.scrollIntoView({ block: "center" }); mark.classList.add("flash"); }
    });
    item.append(link);
    list.append(item);
  });
  box.append(list);
  return box;
}

function chatTarget() {
  if (state.chatTemplate === false) {
    return `Talking to a base model (no chat template): it continues your text, a smoke test rather than an ` +
      `assistant (serve an instruct model, e.g. tightkv serve qwen3:4b, to chat). ${TALK}`;
  }
  return `Talking to the model. ${TALK}`;
}

// Whether the served model has a chat template (tightkv's /api/show says); unknown while it loads.
async function learnModel() {
  try {
    const response = await api("/api/show", json({ model: state.model }));
    const show = await response.json();
    state.chatTemplate = !(show.tightkv && show.tightkv.chat_template === false);
  } catch (_) {
    state.chatTemplate = null;  // asked again at the next message
  }
  if (!state.current) $("target").textContent = chatTarget();
}

// A reply with no text: a line that says so, and why where the model is a base model.
function noReply(reply) {
  const body = reply.querySelector(".body");
  const why = state.chatTemplate === false
    ? "The model wrote nothing. It is a base model without a chat template: it continues text rather than " +
      "answering, so give it the start of a sentence to continue (\u201cThe capital of France is\u201d), or serve " +
      "an instruct model (tightkv serve qwen3:4b)."
    : "The model wrote nothing: it ended its reply at once.";
  body.replaceChildren(el("p", { className: "empty-reply" }, why));
}

async function chat(text, reply) {
  if (state.chatTemplate == null) await learnModel();
  if (state.chatTemplate === false) return continueText(text, reply);
  const body = reply.querySelector(".body");
  const messages = [...state.chat, { role: "user", content: text }];
  const response = await api("/v1/chat/completions", json({ messages, stream: true, max_tokens: 256 }));
  let content = "", failure = null;
  await readEvents(response, (event) => {
    if (event.error) { failure = event.error.message; return; }
    const delta = event.choices && event.choices[0] && event.choices[0].delta;
    if (delta && delta.content) {
      content += delta.content;
      body.innerHTML = md().renderMarkdown(content);
    }
  });
  if (failure) throw new RequestError(failure, 400);
  if (content.trim()) body.innerHTML = md().renderMarkdown(content);
  else noReply(reply);
  state.chat = [...messages, { role: "assistant", content }];
}

// A base model's turn: the conversation so far and the message as questions and answers, continued.
async function continueText(text, reply) {
  const body = reply.querySelector(".body");
  const prompt = `${state.plain}Question: ${text.trim()}\nAnswer:`;
  const request = {
    prompt, stream: true, max_tokens: PLAIN_TOKENS, stop: [PLAIN_STOP],
    temperature: 0, repeat_penalty: BASE_REPEAT_PENALTY,  // greedy, as `tightkv run`: a tiny model sampled rambles
  };
  const response = await api("/v1/completions", json(request));
  let content = "", failure = null;
  await readEvents(response, (event) => {
    if (event.error) { failure = event.error.message; return; }
    const choice = event.choices && event.choices[0];
    if (choice && choice.text) {
      content += choice.text;
      body.textContent = content.trim();
    }
  });
  if (failure) throw new RequestError(failure, 400);
  if (!content.trim()) return noReply(reply);
  body.innerHTML = md().renderMarkdown(content.trim());
  reply.append(el("p", { className: "meta small" }, "continued as plain text (Question: \u2026 Answer:): " +
    "a base model, no chat template"));
  state.plain = `${prompt} ${content.trim()}\n\n`.slice(-6000);  // the last exchanges, well within a context
}

// --- wiring ------------------------------------------------------------------------------------------
function wire() {
  $("file").addEventListener("change", (event) => uploadFile(event.target.files[0]));
  const drop = $("drop");
  for (const name of ["dragenter", "dragover"]) {
    drop.addEventListener(name, (event) => { event.preventDefault(); drop.classList.add("over"); });
  }
  for (const name of ["dragleave", "drop"]) {
    drop.addEventListener(name, () => drop.classList.remove("over"));
  }
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    const file = event.dataTransfer.files[0];
    if (file) uploadFile(file);
  });
  drop.addEventListener("paste", (event) => {  // text pasted onto the drop area goes to the message box
    const text = event.clipboardData && event.clipboardData.getData("text");
    if (text) { event.preventDefault(); $("message").value = text; addTextAsDocument(); }
  });
  $("as-doc").addEventListener("click", addTextAsDocument);
  $("to-chat").addEventListener("click", leaveDocument);
  $("composer").addEventListener("submit", (event) => { event.preventDefault(); send(); });
  $("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
}

async function start() {
  wire();
  try {
    const response = await api("/v1/models");
    const { data } = await response.json();
    $("model").textContent = data.length ? `model ${data[0].id}` : "no model";
    state.model = data.length ? data[0].id : "";
    await refreshList();
    if (state.model) await learnModel();
  } catch (err) {
    $("model").textContent = "not connected";
    showError(err.message);
  }
}

document.addEventListener("DOMContentLoaded", start);
