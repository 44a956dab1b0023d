// zhie's page: sends the text to POST /predict and draws the answer. All text from the user or the model goes into
// the page through textContent (never innerHTML), so it is shown, never parsed.
"use strict";

const PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#008080", "#f032e6", "#9a6324",
                 "#800000", "#000075", "#808000", "#46a0c8"];
const state = { info: null, key: "", colours: new Map() };
const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function colour(label) {
  if (!state.colours.has(label)) state.colours.set(label, PALETTE[state.colours.size % PALETTE.length]);
  return state.colours.get(label);
}

async function call(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  if (state.key) headers.Authorization = "Bearer " + state.key;
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail || data);
    const error = new Error(response.status + ": " + detail);
    error.status = response.status;
    throw error;
  }
  return data;
}

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "muted";
}

// ---------------------------------------------------------------------------------------------- entities, nested
// Spans sorted by start, longest first, become a forest: a span inside another is its child. A span that crosses
// another without nesting cannot be a box inside it; it is drawn in a second line of its own.
function forest(spans) {
  const sorted = [...spans].sort((a, b) => a.start - b.start || b.end - a.end);
  const roots = [], stack = [], crossing = [];
  for (const span of sorted) {
    while (stack.length && stack[stack.length - 1].end <= span.start) stack.pop();
    const parent = stack[stack.length - 1];
    if (parent && span.end > parent.end) { crossing.push(span); continue; }
    const node = { ...span, children: [] };
    (parent ? parent.children : roots).push(node);
    stack.push(node);
  }
  return { roots, crossing };
}

function height(node) {
  return node.children.reduce((h, c) => Math.max(h, height(c) + 1), 0);
}

// Draw text[from:to] into parent with the boxes of nodes (children of one span, or roots).
function drawRange(parent, text, from, to, nodes) {
  let pos = from;
  for (const node of nodes) {
    if (node.start > pos) parent.append(document.createTextNode(text.slice(pos, node.start)));
    const box = el("span", "ent");
    box.dataset.label = node.label;
    box.dataset.start = node.start;
    box.dataset.end = node.end;
    box.title = node.label + (node.score !== undefined ? " · score " + Number(node.score).toFixed(3) : "")
      + " · [" + node.start + ", " + node.end + ")";
    box.style.setProperty("--c", colour(node.label));
    box.style.setProperty("--pad", (2 + 5 * height(node)) + "px");
    drawRange(box, text, node.start, node.end, node.children);
    parent.append(box);
    pos = node.end;
  }
  if (pos < to) parent.append(document.createTextNode(text.slice(pos, to)));
}

function drawEntities(section, text, spans) {
  const { roots, crossing } = forest(spans);
  const doc = el("div", "doc");
  drawRange(doc, text, 0, text.length, roots);
  section.append(doc);
  if (crossing.length) {
    section.append(el("div", "muted", "overlapping entities (they cross the boxes above):"));
    const extra = el("div", "doc");
    drawRange(extra, text, 0, text.length, forest(crossing).roots);
    section.append(extra);
  }
  const table = el("table");
  const head = el("tr");
  for (const name of ["text", "label", "start", "end", "score"]) head.append(el("th", "", name));
  table.append(head);
  for (const s of [...spans].sort((a, b) => a.start - b.start || b.end - a.end)) {
    const row = el("tr");
    for (const v of [s.text, s.label, s.start, s.end, s.score === undefined ? "" : Number(s.score).toFixed(3)]) {
      row.append(el("td", "", String(v)));
    }
    table.append(row);
  }
  if (spans.length) section.append(table); else section.append(el("div", "muted", "no entities"));
}

// ---------------------------------------------------------------------------------------------- words, relations
function drawWords(section, words) {
  const doc = el("div", "doc");
  for (const w of words) {
    if (!w.text.trim()) { doc.append(document.createTextNode(w.text)); continue; }
    const word = el("span", "word", w.text);
    word.title = "[" + w.start + ", " + w.end + ")";
    doc.append(word);
  }
  section.append(doc);
}

function drawRelations(section, text, relations) {
  const mentions = new Map();
  for (const r of relations) {
    for (const [role, s] of [["subject", r.subject], ["object", r.object]]) {
      if (s.start >= 0) mentions.set(s.start + ":" + s.end + ":" + role, { ...s, label: role, score: r.score });
    }
  }
  drawEntities(section, text, [...mentions.values()]);
  const list = el("ul", "relations");
  for (const r of relations) {
    const item = el("li", "relation");
    item.append(el("span", "rel-subject", r.subject.text), el("span", "rel-arrow", "—" + r.predicate + "→"),
                el("span", "rel-object", r.object.text),
                el("span", "muted", " (" + Number(r.score).toFixed(3) + ")"));
    list.append(item);
  }
  if (relations.length) section.append(list); else section.append(el("div", "muted", "no relations"));
}

function drawPrediction(section, task, text, value) {
  if (task === "ner") drawEntities(section, text, value);
  else if (task === "cws") drawWords(section, value);
  else if (task === "re") drawRelations(section, text, value);
  else section.append(el("pre", "", JSON.stringify(value, null, 1)));
}

function drawLegend() {
  const legend = $("legend");
  legend.replaceChildren();
  for (const [label, c] of state.colours) {
    const chip = el("span", "chip", label);
    chip.style.setProperty("--c", c);
    legend.append(chip);
  }
}

// ---------------------------------------------------------------------------------------------- the page
async function analyse() {
  const info = state.info;
  const text = $("text").value;
  const output = $("output");
  setStatus("…");
  try {
    if (info.embeddings && !info.members.length) {
      const lines = text.split("\n").filter((l) => l.trim());
      if (lines.length < 2) { setStatus("type two sentences or more, one per line", true); return; }
      const pairs = await call("POST", "/similarity", { a: lines.slice(1).map(() => lines[0]), b: lines.slice(1) });
      const section = el("section");
      section.append(el("h2", "", "cosine similarity to the first line"));
      const table = el("table");
      for (const p of pairs) {
        const row = el("tr");
        row.append(el("td", "", p.b), el("td", "", p.similarity.toFixed(4)));
        table.append(row);
      }
      section.append(table);
      output.replaceChildren(section);
      setStatus("");
      return;
    }
    const [result] = await call("POST", "/predict", { texts: [text] });
    const value = result[info.output_key];
    const parts = info.members.length ? info.members.map((m) => [m.name, m.task, value[m.name]])
      .filter((p) => p[2] !== undefined) : [[info.task, info.task, value]];
    const sections = parts.map(([name, task, v]) => {
      const section = el("section", "result");
      section.dataset.task = task;
      section.append(el("h2", "", name));
      drawPrediction(section, task, text, v);
      return section;
    });
    output.replaceChildren(...sections);
    drawLegend();
    setStatus("");
  } catch (err) {
    setStatus(err.message, true);
  }
}

async function connect() {
  state.key = $("key").value;
  try {
    state.info = await call("GET", "/info");
  } catch (err) {
    if (err.status === 401) $("keybox").hidden = false;
    setStatus(err.message, true);
    return;
  }
  $("keybox").hidden = true;
  const info = state.info;
  $("model").textContent = info.task + " · " + (info.encoder || "") + " · " + info.runtime + " · zhie " + info.zhie_version;
  const labels = Array.isArray(info.labels) ? info.labels : Object.values(info.labels).flat();
  for (const label of labels) if (label) colour(label);
  drawLegend();
  setStatus("");
}

$("run").addEventListener("click", () => (state.info ? analyse() : connect().then(() => state.info && analyse())));
$("connect").addEventListener("click", connect);
$("text").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("run").click(); });
connect();
