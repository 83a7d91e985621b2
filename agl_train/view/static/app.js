// agl's web view: rollouts, spans and token masks.
//
// Everything shown comes from agents and models, so it is untrusted text: the DOM is built
// with createElement and textContent only, never innerHTML. The bearer key (when the store
// has one) is asked once and kept in sessionStorage.
"use strict";

const API = "/view/api";
const KEY_STORAGE = "agl.view.key";
const REFRESH_MS = 2000;
const ROLE_NAMES = {
  p: ["prompt", "prompt"],
  g: ["generated", "generated, trained (mask 1)"],
  i: ["inserted", "inserted, masked (mask 0)"],
  t: ["truncated", "truncated (over the response limit)"],
  d: ["dropped", "in a dropped row (prompt over the limit)"],
};
const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

// --- DOM helpers -------------------------------------------------------------------------

// h("td", {class: "num"}, "text", child): an element with attributes and children; strings
// become text nodes, so nothing is ever parsed as HTML.
function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    // CSSOM, not a style attribute: the page's content security policy forbids inline styles.
    else if (name === "style") Object.assign(node.style, value);
    else if (name === "checked" || name === "value" || name === "selected") node[name] = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmtTime(seconds) {
  if (seconds === null || seconds === undefined) return "";
  return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19);
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(2)} s`;
  return `${(seconds / 60).toFixed(1)} min`;
}

function fmtReward(value) {
  return value === null || value === undefined ? "—" : String(Math.round(value * 1e4) / 1e4);
}

function statusBadge(status) {
  return h("span", { class: `status status-${status}` }, status);
}

// --- the API and the bearer key -------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path) {
  const headers = { Accept: "application/json" };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(API + path, { headers });
  if (response.status === 401) throw new Unauthorized(key ? "wrong key" : "key required");
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error((body.error && body.error.message) || `HTTP ${response.status}`);
  return body;
}

// Resolves once the user has entered a key; the caller then retries.
function askForKey(message) {
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  document.getElementById("key-error").textContent = message === "wrong key" ? "That key was refused." : "";
  form.hidden = false;
  input.focus();
  return new Promise((resolve) => {
    form.onsubmit = (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY_STORAGE, input.value);
      input.value = "";
      form.hidden = true;
      updateForgetButton();
      resolve();
    };
  });
}

async function load(path) {
  for (;;) {
    try {
      return await api(path);
    } catch (error) {
      if (!(error instanceof Unauthorized)) throw error;
      sessionStorage.removeItem(KEY_STORAGE);
      await askForKey(error.message);
    }
  }
}

// The view's settings do not change while its server runs: fetched once (again after a failure).
let configPromise = null;
function loadConfig() {
  configPromise ??= load("/config").catch((error) => {
    configPromise = null;
    throw error;
  });
  return configPromise;
}

function updateForgetButton() {
  document.getElementById("forget-key").hidden = !sessionStorage.getItem(KEY_STORAGE);
}

// --- routing -----------------------------------------------------------------------------

// One view at a time; a view may register a refresh function that live mode calls.
const state = { refresh: null, token: 0, refreshing: false };

function parseHash() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query || "") };
}

async function route() {
  const token = ++state.token;
  state.refresh = null;
  const main = document.getElementById("main");
  const { parts, params } = parseHash();
  try {
    let view;
    if (parts[0] === "training") view = await trainingView(params);
    else if (parts[0] === "rollouts" && parts[1] && parts[2] === "tokens") view = await tokenView(parts[1], params);
    else if (parts[0] === "rollouts" && parts[1]) view = await rolloutView(parts[1]);
    else view = await listView(params);
    if (token !== state.token) return; // the user moved on while this view loaded
    main.replaceChildren(view.node);
    state.refresh = view.refresh || null;
  } catch (error) {
    if (token !== state.token) return;
    main.replaceChildren(h("p", { class: "error", "data-testid": "error" }, `Error: ${error.message}`));
  }
}

async function liveTick() {
  const token = state.token;
  if (!state.refresh || state.refreshing || !document.getElementById("live").checked) return;
  if (!document.getElementById("key-form").hidden) return; // waiting for the user's key
  state.refreshing = true;
  try {
    await state.refresh(() => token === state.token);
  } catch (error) {
    // A failed refresh keeps the last good page; the next tick tries again.
  } finally {
    state.refreshing = false;
  }
}

// --- the rollout list ----------------------------------------------------------------------

function listQuery(params) {
  const query = new URLSearchParams();
  for (const name of ["status", "mode", "after", "before", "q", "limit", "offset"]) {
    for (const value of params.getAll(name)) if (value !== "") query.append(name, value);
  }
  return query;
}

function toEpoch(local) {
  // datetime-local values are in the browser's time zone; the store keeps epoch seconds.
  return local ? String(new Date(local).getTime() / 1000) : "";
}

function fromEpoch(seconds) {
  if (!seconds) return "";
  const date = new Date(Number(seconds) * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

function filterForm(config, params) {
  const chosen = new Set(params.getAll("status").flatMap((s) => s.split(",")));
  const statuses = config.statuses.map((status) =>
    h("label", {}, h("input", { type: "checkbox", name: "status", value: status, checked: chosen.has(status) }), status),
  );
  const mode = h(
    "select",
    { name: "mode" },
    h("option", { value: "" }, "any"),
    config.modes.map((m) => h("option", { value: m, selected: params.get("mode") === m }, m)),
  );
  const form = h(
    "form",
    { class: "filters", "data-testid": "filters" },
    h("fieldset", {}, h("legend", {}, "status"), statuses),
    h("label", {}, "mode ", mode),
    h("label", {}, "started after ", h("input", { type: "datetime-local", name: "after", value: fromEpoch(params.get("after")) })),
    h("label", {}, "before ", h("input", { type: "datetime-local", name: "before", value: fromEpoch(params.get("before")) })),
    h("label", {}, "id contains ", h("input", { type: "search", name: "q", value: params.get("q") || "", size: 14 })),
    h("label", {}, "per page ", h("input", { type: "number", name: "limit", min: 1, max: config.max_page_size, value: params.get("limit") || "50", style: { width: "5em" } })),
    h("button", { type: "submit" }, "Apply"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const next = new URLSearchParams();
    for (const status of data.getAll("status")) next.append("status", status);
    if (data.get("mode")) next.set("mode", data.get("mode"));
    if (data.get("after")) next.set("after", toEpoch(data.get("after")));
    if (data.get("before")) next.set("before", toEpoch(data.get("before")));
    if (data.get("q")) next.set("q", data.get("q"));
    if (data.get("limit") && data.get("limit") !== "50") next.set("limit", data.get("limit"));
    location.hash = `#/?${next}`;
  });
  form.addEventListener("change", (event) => {
    if (event.target.type === "checkbox" || event.target.tagName === "SELECT") form.requestSubmit();
  });
  return form;
}

function rolloutRow(item) {
  const link = `#/rollouts/${encodeURIComponent(item.rollout_id)}`;
  return h(
    "tr",
    { "data-rollout-id": item.rollout_id },
    h("td", {}, h("a", { href: link }, item.rollout_id)),
    h("td", {}, statusBadge(item.status)),
    h("td", {}, item.mode || ""),
    h("td", {}, fmtTime(item.start_time)),
    h("td", { class: "num" }, fmtDuration(item.duration)),
    h("td", { class: "num" }, item.attempts),
    h("td", { class: "num" }, fmtReward(item.reward)),
    h("td", { class: "num" }, item.n_calls),
    h("td", { class: "num" }, `${item.tokens_in} / ${item.tokens_out}`),
    h("td", {}, item.n_calls ? h("a", { href: `${link}/tokens` }, "tokens") : ""),
  );
}

function rolloutTable(page) {
  const head = ["rollout", "status", "mode", "started (UTC)", "duration", "attempts", "reward", "LLM calls", "tokens in / out", ""];
  return h(
    "table",
    { class: "rollouts", "data-testid": "rollouts" },
    h("thead", {}, h("tr", {}, head.map((name, i) => h("th", { class: i >= 4 && i <= 8 ? "num" : null }, name)))),
    h("tbody", {}, page.items.map(rolloutRow)),
  );
}

// "← newer  1–50 of 120  older →" over a page of `shown` items; `base` is the view's hash path.
function pager(page, params, shown, base = "#/", noun = "") {
  const at = (offset) => {
    const next = new URLSearchParams(params);
    next.set("offset", String(Math.max(0, offset)));
    return `${base}?${next}`;
  };
  const first = page.total ? page.offset + 1 : 0;
  const last = page.offset + shown;
  return h(
    "div",
    { class: "pager", "data-testid": "pager" },
    page.offset > 0 ? h("a", { href: at(page.offset - page.limit) }, "← newer") : h("span", { class: "muted" }, "← newer"),
    h("span", { "data-testid": "page-range" }, `${noun}${first}–${last} of ${page.total}`),
    last < page.total ? h("a", { href: at(page.offset + page.limit) }, "older →") : h("span", { class: "muted" }, "older →"),
  );
}

async function listView(params) {
  const config = await loadConfig();
  const query = listQuery(params);
  const page = await load(`/rollouts?${query}`);
  const table = h("div", {}, pager(page, params, page.items.length), rolloutTable(page));
  const node = h("section", {}, h("h1", {}, "Rollouts"), filterForm(config, params), table);
  return {
    node,
    refresh: async (current) => {
      const fresh = await load(`/rollouts?${query}`);
      if (current()) table.replaceChildren(pager(fresh, params, fresh.items.length), rolloutTable(fresh));
    },
  };
}

// --- the training page ----------------------------------------------------------------------

function fmtSpread(reward) {
  if (!reward || !reward.n) return "—";
  return `${fmtReward(reward.mean)} ± ${fmtReward(reward.std)}`;
}

function fmtRange(reward) {
  return reward && reward.n ? `${fmtReward(reward.min)} … ${fmtReward(reward.max)}` : "";
}

// "3 ok · 1 failed · 1 timed out · 2 running": zero counts left out, so a healthy step reads short.
function outcomes(mode) {
  if (!mode) return h("span", { class: "muted" }, "—");
  const parts = [
    [mode.succeeded, "ok", "ok"],
    [mode.failed, "failed", "bad"],
    [mode.timeout, "timed out", "bad"],
    [mode.cancelled, "cancelled", "muted"],
    [mode.running, "running", "live"],
    [mode.queued, "queued", "live"],
  ].filter(([n]) => n);
  if (!parts.length) return h("span", { class: "muted" }, "none");
  return parts.flatMap(([n, label, kind], i) => [i ? " · " : "", h("span", { class: `count-${kind}` }, `${n} ${label}`)]);
}

function stepRow(step) {
  const train = step.modes.train;
  const val = step.modes.val;
  const cell = (testid, ...content) => h("td", { class: "num", "data-testid": testid }, ...content);
  return h(
    "tr",
    { "data-step": step.step ?? step.resources_ids[0] },
    h("td", {}, step.step ?? h("span", { class: "muted", title: step.resources_ids.join(", ") }, "?"), step.finished ? "" : [" ", h("span", { class: "status status-running", "data-testid": "live-step" }, "live")]),
    h("td", {}, fmtTime(step.published)),
    h("td", { "data-testid": "train-outcomes" }, outcomes(train)),
    cell("train-reward", fmtSpread(train && train.reward)),
    cell("train-range", fmtRange(train && train.reward)),
    cell("train-rows", train ? train.rows : ""),
    cell("train-tokens", train ? train.trained_tokens : ""),
    h("td", { "data-testid": "val-outcomes" }, outcomes(val)),
    cell("val-reward", fmtSpread(val && val.reward)),
    cell("val-range", fmtRange(val && val.reward)),
  );
}

function stepsTable(page) {
  const head = h(
    "thead",
    {},
    h("tr", {}, h("th", { rowspan: 2 }, "step"), h("th", { rowspan: 2 }, "published (UTC)"), h("th", { colspan: 5, class: "group" }, "train"), h("th", { colspan: 3, class: "group" }, "validation")),
    h(
      "tr",
      {},
      ["rollouts", "reward mean ± std", "min … max", "rows", "trained tokens", "rollouts", "reward mean ± std", "min … max"].map((name, i) =>
        h("th", { class: i === 0 || i === 5 ? null : "num" }, name),
      ),
    ),
  );
  return h("table", { class: "steps", "data-testid": "steps" }, head, h("tbody", {}, page.steps.map(stepRow)));
}

// s("circle", {cx: 1}): an SVG element; attributes only, never markup.
function s(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  for (const child of children.flat()) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

// Mean reward per step, train and validation, oldest left; train's min … max as a bar per step.
function rewardChart(steps) {
  const shown = steps.filter((step) => Object.values(step.modes).some((m) => m.reward.n)).reverse();
  if (shown.length < 1) return null;
  const [width, height, left, right, top, bottom] = [640, 170, 44, 12, 10, 24];
  const values = shown.flatMap((step) => Object.values(step.modes).flatMap((m) => (m.reward.n ? [m.reward.min, m.reward.max] : [])));
  let [low, high] = [Math.min(...values), Math.max(...values)];
  if (high === low) [low, high] = [low - 0.5, high + 0.5];
  const inset = 16; // points clear of the axis and the edge
  const span = width - left - right - 2 * inset;
  const x = (i) => left + inset + (shown.length === 1 ? span / 2 : (i * span) / (shown.length - 1));
  const y = (v) => top + ((high - v) * (height - top - bottom)) / (high - low);
  const chart = s("svg", { class: "reward-chart", "data-testid": "reward-chart", viewBox: `0 0 ${width} ${height}`, width, height, role: "img" });
  chart.append(s("title", {}, "mean reward per step: train (blue, with min … max) and validation (orange)"));
  for (const v of [low, (low + high) / 2, high]) {
    chart.append(s("line", { class: "grid", x1: left, x2: width - right, y1: y(v), y2: y(v) }));
    chart.append(s("text", { class: "axis", x: left - 6, y: y(v) + 4, "text-anchor": "end" }, fmtReward(v)));
  }
  shown.forEach((step, i) => chart.append(s("text", { class: "axis", x: x(i), y: height - 6, "text-anchor": "middle" }, step.step ?? "?")));
  for (const mode of ["train", "val"]) {
    const points = shown.map((step, i) => [i, step.modes[mode]]).filter(([, m]) => m && m.reward.n);
    if (mode === "train") for (const [i, m] of points) chart.append(s("line", { class: "range", x1: x(i), x2: x(i), y1: y(m.reward.min), y2: y(m.reward.max) }));
    if (points.length > 1) chart.append(s("polyline", { class: `line ${mode}`, points: points.map(([i, m]) => `${x(i)},${y(m.reward.mean)}`).join(" ") }));
    for (const [i, m] of points) chart.append(s("circle", { class: `point ${mode}`, cx: x(i), cy: y(m.reward.mean), r: 3.5 }, s("title", {}, `${mode} step ${shown[i].step}: ${fmtSpread(m.reward)}`)));
  }
  return h("figure", { class: "chart" }, chart, h("figcaption", { class: "muted" }, h("span", { class: "key train" }, "train"), " ", h("span", { class: "key val" }, "validation"), " mean reward per step; bars: train min … max"));
}

function stepsBody(page, params) {
  if (!page.total) return [h("p", { class: "muted", "data-testid": "no-steps" }, "No resources published yet: the trainer publishes one set per step.")];
  return [rewardChart(page.steps), pager(page, params, Math.max(0, Math.min(page.limit, page.total - page.offset)), "#/training", "resource sets "), stepsTable(page)].filter(Boolean);
}

async function trainingView(params) {
  const query = new URLSearchParams();
  for (const name of ["limit", "offset"]) if (params.get(name)) query.set(name, params.get(name));
  const page = await load(`/steps?${query}`);
  const body = h("div", {}, stepsBody(page, params));
  const node = h(
    "section",
    { "data-testid": "training" },
    h("h1", {}, "Training"),
    h(
      "p",
      { class: "muted" },
      "One row per weight version (the trainer's step): the rollouts enqueued under the resources it published. ",
      "Rewards of succeeded rollouts; rows and trained tokens as the trace aggregator builds them.",
    ),
    body,
  );
  return {
    node,
    refresh: async (current) => {
      const fresh = await load(`/steps?${query}`);
      if (current()) body.replaceChildren(...stepsBody(fresh, params));
    },
  };
}

// --- one rollout ---------------------------------------------------------------------------

function summaryBlock(pairs) {
  return h("div", { class: "summary" }, pairs.map(([name, value]) => h("div", {}, h("span", {}, name), value)));
}

function attemptsTable(attempts) {
  return h(
    "table",
    { "data-testid": "attempts" },
    h("thead", {}, h("tr", {}, ["#", "attempt", "status", "started (UTC)", "ended", "worker"].map((n) => h("th", {}, n)))),
    h(
      "tbody",
      {},
      attempts.map((a) =>
        h("tr", {}, h("td", {}, a.sequence_id), h("td", {}, a.attempt_id), h("td", {}, statusBadge(a.status)),
          h("td", {}, fmtTime(a.start_time)), h("td", {}, fmtTime(a.end_time)), h("td", {}, a.worker_id || "")),
      ),
    ),
  );
}

function spanBar(span, t0, total) {
  const track = h("div", { class: "bar-track" });
  if (span.start_time === null || span.start_time === undefined || !total) return track;
  const left = ((span.start_time - t0) / total) * 100;
  const width = (((span.end_time ?? span.start_time) - span.start_time) / total) * 100;
  const kind = span.status === "ERROR" ? "error" : span.name === "agl.reward" ? "reward" : "";
  track.append(h("div", { class: `bar ${kind}`, style: { left: `${left.toFixed(3)}%`, width: `${width.toFixed(3)}%` } }));
  return track;
}

async function spanDetail(rolloutId, spanId) {
  const [span, config] = await Promise.all([
    load(`/rollouts/${encodeURIComponent(rolloutId)}/spans/${encodeURIComponent(spanId)}`),
    loadConfig(),
  ]);
  const names = config.call_span;
  const attributes = span.attributes || {};
  const parts = [];
  const show = (title, value) => parts.push(h("h3", {}, title), h("pre", { class: "json" }, JSON.stringify(value, null, 2)));
  if (names.request in attributes) show("request", attributes[names.request]);
  if (names.response in attributes) show("response", attributes[names.response]);
  if (attributes[names.error]) show("error", attributes[names.error]);
  const rest = { ...span, attributes: Object.fromEntries(Object.entries(attributes).filter(([k]) => k !== names.request && k !== names.response)) };
  show("span", rest);
  return h("div", { "data-testid": "span-detail" }, parts);
}

// A call whose token ids are missing or do not match is not trained as recorded: shown loud, with its cause.
function tokenIdsBadge(span) {
  const status = span.token_ids_status;
  if (!status) return "";
  if (status === "ok") return h("span", { class: "muted" }, "ok");
  return h("span", { class: "badge token-ids-bad", "data-testid": "token-ids-status", title: span.token_ids_cause || "" }, status, span.token_ids_cause ? `: ${span.token_ids_cause}` : "");
}

// How the call's prompt was made (the proxy's token chain): continuing an earlier call (bridged, retry) or
// not, and why; a branch is shown loud, since the trainer starts a new row there.
function chainCell(span) {
  const chain = span.chain;
  if (!chain) return "";
  const parent = span.chain_parent_sequence !== undefined && span.chain_parent_sequence !== null ? ` ← #${span.chain_parent_sequence}` : "";
  const choice = chain.choice ? ` (choice ${chain.choice})` : "";
  const text = `${chain.prompt}${parent}${choice}${chain.cause ? `: ${chain.cause}` : ""}`;
  const loud = chain.prompt === "branched";
  return h("span", { class: loud ? "badge chain-branched" : "muted", "data-testid": "chain" }, text);
}

function spansTable(rolloutId, spans) {
  const starts = spans.map((s) => s.start_time).filter((t) => t !== null && t !== undefined);
  const ends = spans.map((s) => s.end_time ?? s.start_time).filter((t) => t !== null && t !== undefined);
  const t0 = starts.length ? Math.min(...starts) : 0;
  const total = ends.length ? Math.max(...ends) - t0 : 0;
  const body = h("tbody", {});
  for (const span of spans) {
    const tokens = span.tokens_in !== undefined ? `${span.tokens_in} / ${span.tokens_out}` : "";
    const row = h(
      "tr",
      { class: "span-row", "data-span-id": span.span_id, title: "click for request and response" },
      h("td", { class: "num" }, span.sequence_id ?? ""),
      h("td", {}, span.name, span.reward !== undefined ? ` = ${fmtReward(span.reward)}` : ""),
      h("td", { class: "num" }, span.start_time === null ? "" : `+${fmtDuration(span.start_time - t0)}`),
      h("td", { class: "num" }, fmtDuration(span.duration)),
      h("td", { class: "bar-cell" }, spanBar(span, t0, total)),
      h("td", {}, span.backend || ""),
      h("td", {}, span.api || ""),
      h("td", {}, tokenIdsBadge(span)),
      h("td", {}, chainCell(span)),
      h("td", { class: "num" }, tokens),
      h("td", {}, statusBadge(span.status), span.status_description ? ` ${span.status_description}` : ""),
    );
    let open = null;
    row.addEventListener("click", async () => {
      if (open) {
        open.remove();
        open = null;
        return;
      }
      open = h("tr", { class: "span-open" }, h("td", { colspan: 11 }, h("p", { class: "muted" }, "Loading…")));
      row.after(open);
      const cell = open.firstChild;
      try {
        cell.replaceChildren(await spanDetail(rolloutId, span.span_id));
      } catch (error) {
        cell.replaceChildren(h("p", { class: "error" }, `Error: ${error.message}`));
      }
    });
    body.append(row);
  }
  const head = ["seq", "name", "start", "duration", "timeline", "backend", "API", "token ids", "prompt (chain)", "tokens in / out", "status"];
  return h("table", { "data-testid": "spans" }, h("thead", {}, h("tr", {}, head.map((n) => h("th", {}, n)))), body);
}

async function rolloutView(rolloutId) {
  const detail = await load(`/rollouts/${encodeURIComponent(rolloutId)}`);
  const { rollout, summary } = detail;
  const body = h("div", {});
  const render = (d) =>
    body.replaceChildren(
      summaryBlock([
        ["status", statusBadge(d.rollout.status)],
        ["mode", d.rollout.mode || "—"],
        ["started", fmtTime(d.rollout.start_time)],
        ["duration", fmtDuration(d.summary.duration)],
        ["attempts", String(d.summary.attempts)],
        ["reward", fmtReward(d.summary.reward)],
        ["LLM calls", String(d.summary.n_calls)],
        ["tokens in / out", `${d.summary.tokens_in} / ${d.summary.tokens_out}`],
      ]),
      h("h2", {}, "Input"),
      h("pre", { class: "json", "data-testid": "input" }, JSON.stringify(d.rollout.input, null, 2)),
      h("h2", {}, "Attempts"),
      attemptsTable(d.attempts),
      h("h2", {}, `Spans (${d.spans.length}, in sequence order)`),
      spansTable(rolloutId, d.spans),
    );
  render(detail);
  const node = h(
    "section",
    {},
    h("h1", {}, "Rollout ", h("code", {}, rollout.rollout_id)),
    h("p", {}, h("a", { href: "#/" }, "← all rollouts"), " · ", h("a", { href: `#/rollouts/${encodeURIComponent(rolloutId)}/tokens` }, "token view")),
    body,
  );
  // Re-render only when something changed: a re-render closes the spans the user opened.
  const signature = (d) => JSON.stringify([d.rollout.status, d.attempts.map((a) => a.status), d.spans.length, d.summary.reward]);
  let shown = signature(detail);
  let finished = FINISHED.has(rollout.status);
  return {
    node,
    refresh: async (current) => {
      if (finished) return; // a finished rollout no longer changes
      const fresh = await load(`/rollouts/${encodeURIComponent(rolloutId)}`);
      if (!current() || signature(fresh) === shown) return;
      shown = signature(fresh);
      finished = FINISHED.has(fresh.rollout.status);
      render(fresh);
    },
  };
}

// --- the token view ------------------------------------------------------------------------

function tokenText(id, pieces, decoded) {
  if (!decoded) return `${id} `;
  const text = pieces[String(id)];
  return text === undefined || text === "" ? "·" : text;
}

function legend() {
  return h(
    "div",
    { class: "legend", "data-testid": "legend" },
    Object.entries(ROLE_NAMES).map(([, [role, label]]) => h("span", { class: `tok role-${role}` }, label)),
  );
}

function windowText(ids, pieces, decoded) {
  // One line: newlines shown as ⏎, so the two windows line up for comparison.
  return ids.map((id) => tokenText(id, pieces, decoded)).join("").replaceAll("\n", "⏎");
}

function breakBox(record, pieces, decoded) {
  return h(
    "div",
    { class: "break", "data-testid": "prefix-break" },
    h("strong", {}, `Prefix broke at call ${record.turn_index}: ${record.kind}`),
    ` — ${record.explanation}. `,
    `Diverged at token ${record.diverge_at} (previous context ${record.context_length} tokens, new prompt ${record.prompt_length}).`,
    h("div", {}, "context around it: ", h("code", {}, windowText(record.context_window, pieces, decoded))),
    h("div", {}, "new prompt around it: ", h("code", {}, windowText(record.prompt_window, pieces, decoded))),
  );
}

const VERSION_COLOURS = 4; // .tok.ver-0 … ver-3 in app.css

function versionColours(row) {
  // The row's weight versions, coloured in the order they sampled: a row spans a few versions, whose numbers grow without bound.
  const colours = new Map();
  for (const [version] of row.versions) if (version !== null && !colours.has(version)) colours.set(version, colours.size % VERSION_COLOURS);
  return colours;
}

function tokenVersions(row) {
  // One per token: null for the prompt, then the response's segments (null: inserted, or a call of unknown version).
  const out = new Array(row.prompt_length).fill(null);
  for (const [version, n] of row.versions) for (let k = 0; k < n; k++) out.push(version);
  return out;
}

function versionLegend(row, colours) {
  const known = row.versions.filter(([version]) => version !== null);
  if (!known.length) return null;
  const segments = known.flatMap(([version, n], k) => [k ? " → " : "", h("span", { class: `tok ver-${colours.get(version)}` }, `v${version} × ${n}`)]);
  return h("span", { "data-testid": "row-versions" }, "sampled by ", segments);
}

function tokenRow(row, index, view) {
  const tokens = h("div", { class: "tokens" });
  const fragment = document.createDocumentFragment();
  const colours = versionColours(row);
  const versions = tokenVersions(row);
  for (let k = 0; k < row.ids.length; k++) {
    const [role, label] = ROLE_NAMES[row.roles[k]];
    const id = row.ids[k];
    const version = versions[k];
    const sampled = version === null ? {} : { class: `tok role-${role} ver-${colours.get(version)}`, "data-version": version, title: `id ${id} · ${label} · v${version}` };
    fragment.append(h("span", { class: `tok role-${role}`, "data-role": role, title: `id ${id} · ${label}`, ...sampled }, tokenText(id, view.pieces, view.decoded)));
  }
  tokens.append(fragment);
  const badges = [];
  if (row.is_drop) badges.push(h("span", { class: "badge dropped" }, `dropped: prompt ${row.prompt_length} > ${view.limits.max_prompt_length}`));
  if (row.truncated) badges.push(h("span", { class: "badge truncated" }, `truncated to ${row.response_length} response tokens`));
  return h(
    "div",
    { class: `token-row${row.is_drop ? " dropped" : ""}`, "data-testid": "token-row" },
    row.break ? breakBox(row.break, view.pieces, view.decoded) : null,
    h(
      "div",
      { class: "row-head" },
      h("strong", {}, `Row ${index + 1}`),
      h("span", {}, `calls ${row.turn_index}–${row.turn_index + row.n_calls - 1} (seq ${row.sequence_ids.join(", ")})`),
      h("span", {}, `prompt ${row.prompt_length} · response ${row.response_length} · trained ${row.trained_tokens}`),
      h("span", {}, `reward ${fmtReward(row.reward)}`),
      versionLegend(row, colours),
      badges,
    ),
    tokens,
  );
}

async function tokenView(rolloutId, params) {
  const config = await loadConfig();
  const query = new URLSearchParams();
  for (const name of ["level", "max_prompt_length", "max_response_length"]) if (params.get(name)) query.set(name, params.get(name));
  const view = await load(`/rollouts/${encodeURIComponent(rolloutId)}/tokens?${query}`);
  const controls = h(
    "form",
    { class: "controls", "data-testid": "token-controls" },
    h("label", {}, "level ", h("select", { name: "level" }, config.levels.map((l) => h("option", { value: l, selected: view.level === l }, l)))),
    h("label", {}, "max prompt ", h("input", { type: "number", name: "max_prompt_length", min: 1, value: view.limits.max_prompt_length, style: { width: "7em" } })),
    h("label", {}, "max response ", h("input", { type: "number", name: "max_response_length", min: 1, value: view.limits.max_response_length, style: { width: "7em" } })),
    h("button", { type: "submit" }, "Rebuild rows"),
  );
  controls.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams(new FormData(controls));
    location.hash = `#/rollouts/${encodeURIComponent(rolloutId)}/tokens?${next}`;
  });
  const skipped = Object.entries(view.skipped).map(([reason, n]) => `${reason}: ${n}`).join(", ");
  const node = h(
    "section",
    { "data-testid": "token-view" },
    h("h1", {}, "Tokens of ", h("code", {}, rolloutId)),
    h("p", {}, h("a", { href: `#/rollouts/${encodeURIComponent(rolloutId)}` }, "← rollout"), " · rows built by agl_train's trace aggregator, as the trainer builds them"),
    controls,
    summaryBlock([
      ["reward", h("span", { "data-testid": "reward" }, view.has_reward ? fmtReward(view.reward) : `${fmtReward(view.reward)} (no reward span: fill value)`)],
      ["attempt", view.attempt_id || "—"],
      ["LLM calls", String(view.n_calls)],
      ["rows", String(view.rows.length)],
      ["prefix breaks", String(view.metrics["training/n_prefix_breaks"] ?? 0)],
      ["tokens", view.decoded ? `decoded with ${view.tokenizer}` : "raw ids (no tokenizer: start with --tokenizer, or publish a model readable here)"],
      ["skipped calls", skipped || "none"],
    ]),
    legend(),
    view.rows.length ? view.rows.map((row, i) => tokenRow(row, i, view)) : h("p", { class: "muted" }, "No trainable LLM calls in the latest attempt."),
  );
  return { node };
}

// --- start -----------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("forget-key").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORAGE);
    updateForgetButton();
    route();
  });
  updateForgetButton();
  window.addEventListener("hashchange", route);
  setInterval(liveTick, REFRESH_MS);
  route();
});
