// rutster operator dashboard. Plain ES2020 module: no framework, no build step, no CDN.
//
// Data comes from GET /v1/dashboard/events, an SSE stream that needs the Authorization header,
// so it is read with fetch() + ReadableStream (EventSource cannot send headers) and parsed here.
// Every string from the server reaches the page through textContent / setAttribute only (never
// innerHTML). Money arrives as decimal USD strings and is handled as BigInt micro-dollars, so no
// float ever touches an amount.

// ---------------------------------------------------------------------------------------------
// Constants

/** sessionStorage key for the API key (tab-scoped: gone when the tab closes). */
export const SESSION_KEY = "rutster.dashboard.apiKey";
const EVENTS_URL = "/v1/dashboard/events";
const KILL_SWITCH_URL = "/v1/admin/kill-switch";

// First reconnect after 500 ms, doubling to at most 10 s (seed decision: the server pushes a
// snapshot every DASHBOARD_PUSH_S = 1 s, so a half-second first retry loses at most one
// snapshot, and the 10 s cap bounds the load of many open dashboards during an outage).
export const RECONNECT_INITIAL_MS = 500;
export const RECONNECT_MAX_MS = 10_000;
// ±20 % jitter so dashboards dropped by one gateway restart do not reconnect in lockstep
// (seed decision).
const RECONNECT_JITTER = 0.2;
// No byte at all (snapshot or keepalive comment) for this long means the stream is dead even if
// TCP has not noticed: 10 missed DASHBOARD_PUSH_S = 1 s pushes (seed decision).
const STALE_STREAM_MS = 10_000;
// How often the stale-stream watchdog looks (a tenth of the stale limit).
const WATCHDOG_INTERVAL_MS = 1_000;
// The armed kill-switch "confirm" button disarms itself after this long, so a stray click much
// later cannot flip the switch (seed decision).
const CONFIRM_TIMEOUT_MS = 10_000;
// Lists render at most this many entries; the server caps its lists too, this only protects the
// DOM from an oversized payload (seed decision).
const MAX_LIST_ROWS = 100;
// One SSE line longer than this (no newline yet) is dropped and counted instead of growing the
// buffer forever: a snapshot of ~2,000 active calls is ~0.5 MB of JSON (measured shape of one
// active_calls entry ≈ 250 bytes), so 8 Mi characters leaves 16x headroom (seed decision).
export const MAX_SSE_LINE_CHARS = 8 * 1024 * 1024;
// Chart geometry (SVG user units) and how many hourly bars it shows: 24 h per design.md.
const CHART_HOURS = 24;
const CHART_W = 360;
const CHART_H = 132;
const CHART_LEFT = 56;
const CHART_RIGHT = 8;
const CHART_TOP = 14;
const CHART_BOTTOM = 22;
// Label every 6th hour on the x axis (4 labels over 24 h keep the 360-unit-wide chart legible).
const CHART_LABEL_EVERY = 6;

const MICROS_PER_USD = 1_000_000n;
// Decimal USD as sent by the server: digits, optional point and at most 6 decimals (micros).
const MONEY_RE = /^(\d{1,15})(?:\.(\d{1,6}))?$/;

// ---------------------------------------------------------------------------------------------
// Money: decimal strings <-> BigInt micros, no floats

/** Parse a decimal USD string ("0.004200") to BigInt micros; null when it is not one. */
export function parseMicros(text) {
  if (typeof text !== "string") return null;
  const match = MONEY_RE.exec(text);
  if (match === null) return null;
  const frac = (match[2] ?? "").padEnd(6, "0");
  return BigInt(match[1]) * MICROS_PER_USD + BigInt(frac);
}

/** Format BigInt micros as "$1,234.50" / "$0.0042" (exact: trailing zeros trimmed to 2 places). */
export function formatMicros(micros) {
  const negative = micros < 0n;
  const abs = negative ? -micros : micros;
  const whole = (abs / MICROS_PER_USD).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  let frac = (abs % MICROS_PER_USD).toString().padStart(6, "0").replace(/0+$/, "");
  if (frac.length < 2) frac = frac.padEnd(2, "0");
  return `${negative ? "-" : ""}$${whole}.${frac}`;
}

/** Display a server amount; "—" when it is missing or malformed (never a guess). */
export function formatUsd(text) {
  const micros = parseMicros(text);
  return micros === null ? "—" : formatMicros(micros);
}

/** Sum decimal USD strings exactly (BigInt micros); malformed entries count as zero. */
export function sumMicros(texts) {
  let total = 0n;
  for (const text of texts) total += parseMicros(text) ?? 0n;
  return total;
}

/** Share of ``budget`` used by ``used`` in basis points (10000 = 100 %), integer maths. */
export function basisPoints(used, budget) {
  if (budget <= 0n) return 0;
  return Number((used * 10000n) / budget);
}

/** "42.5 %" from basis points, without float rounding surprises. */
export function formatBasisPoints(bp) {
  const tenths = Math.floor(bp / 10);
  return `${Math.floor(tenths / 10)}.${tenths % 10} %`;
}

// ---------------------------------------------------------------------------------------------
// Small formatters (not money)

/** "1:02:03" / "2:05" from seconds; "—" when not a finite, non-negative number. */
export function formatDuration(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < 0) return "—";
  const total = Math.floor(seconds);
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = String(total % 60).padStart(2, "0");
  return h > 0 ? `${h}:${String(m).padStart(2, "0")}:${s}` : `${m}:${s}`;
}

/** "12:00:05" from an RFC 3339 UTC timestamp; the raw text when it does not look like one. */
export function formatClock(text) {
  if (typeof text !== "string") return "";
  const match = /T(\d{2}:\d{2}:\d{2})/.exec(text);
  return match === null ? text : match[1];
}

function str(value, fallback = "—") {
  if (value === null || value === undefined || value === "") return fallback;
  return typeof value === "string" ? value : String(value);
}

function asArray(value) {
  return Array.isArray(value) ? value : [];
}

// ---------------------------------------------------------------------------------------------
// SSE parsing (WHATWG HTML "event stream interpretation"), incremental over byte chunks

/**
 * Incremental text/event-stream parser. Feed it the byte chunks of a ReadableStream in order;
 * it returns the events completed by each chunk. Chunks may split anywhere: inside a UTF-8
 * sequence, a line, a CR LF pair or the blank line that ends an event.
 */
export class SseParser {
  constructor({ maxLineChars = MAX_SSE_LINE_CHARS } = {}) {
    this.maxLineChars = maxLineChars;
    this.decoder = new TextDecoder("utf-8");
    this.buffer = "";
    this.skipLeadingLF = false;
    this.eventType = "";
    this.dataLines = [];
    this.lastEventId = "";
    this.retryMs = null;
    this.comments = 0;
    this.oversizedLines = 0;
    this.discarding = false;
    this.discardingLine = false;
  }

  /** Feed one chunk (Uint8Array or string); returns the events it completed, in order. */
  push(chunk) {
    let text = typeof chunk === "string" ? chunk : this.decoder.decode(chunk, { stream: true });
    const events = [];
    if (text === "") return events;
    if (this.skipLeadingLF) {
      // The previous chunk ended on CR; a LF right after it belongs to the same line break.
      this.skipLeadingLF = false;
      if (text[0] === "\n") text = text.slice(1);
    }
    let start = 0;
    const breaks = /\r\n|\r|\n/g;
    let match;
    while ((match = breaks.exec(text)) !== null) {
      const piece = text.slice(start, match.index);
      start = breaks.lastIndex;
      if (match[0] === "\r" && start === text.length) this.skipLeadingLF = true;
      if (this.discarding) {
        // Skipping the rest of an event that had an oversized line, up to its blank line.
        const blank = piece === "" && !this.discardingLine;
        this.discardingLine = false;
        if (blank) this.discarding = false;
        continue;
      }
      const line = this.buffer + piece;
      this.buffer = "";
      this.processLine(line, events);
    }
    const rest = text.slice(start);
    if (this.discarding) {
      if (rest !== "") this.discardingLine = true;
    } else if (this.buffer.length + rest.length > this.maxLineChars) {
      // Drop the oversized line and the whole event it belongs to (counted), not the page.
      this.oversizedLines += 1;
      this.buffer = "";
      this.dataLines = [];
      this.eventType = "";
      this.discarding = true;
      this.discardingLine = true;
    } else {
      this.buffer += rest;
    }
    return events;
  }

  processLine(line, events) {
    if (line === "") {
      if (this.dataLines.length > 0) {
        events.push({
          type: this.eventType === "" ? "message" : this.eventType,
          data: this.dataLines.join("\n"),
          lastEventId: this.lastEventId,
        });
      }
      this.dataLines = [];
      this.eventType = "";
      return;
    }
    if (line[0] === ":") {
      this.comments += 1; // keepalive / comment
      return;
    }
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    if (field === "event") this.eventType = value;
    else if (field === "data") this.dataLines.push(value);
    else if (field === "id") {
      if (!value.includes("\0")) this.lastEventId = value;
    } else if (field === "retry") {
      if (/^\d+$/.test(value)) this.retryMs = Number(value);
    }
    // Any other field is ignored, as the spec says.
  }
}

// ---------------------------------------------------------------------------------------------
// DOM helpers

const SVG_NS = "http://www.w3.org/2000/svg";

/** Create an element with attributes and text/children; text always goes through textContent. */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------------------------------------
// Rendering

/** Keyed rows of the active-calls table: call id -> <tr>, so rows persist between snapshots. */
const callRows = new Map();
/** Keyed tenant cards: tenant id -> <article>. */
const tenantCards = new Map();

const CALL_COLUMNS = ["id", "tenant", "provider", "brain", "state", "duration", "spend", "reserved"];

function renderCalls(calls) {
  const body = $("active-calls-body");
  const seen = new Set();
  const rows = [];
  for (const call of calls) {
    if (call === null || typeof call !== "object" || typeof call.id !== "string") continue;
    if (seen.has(call.id)) continue;
    seen.add(call.id);
    let row = callRows.get(call.id);
    if (row === undefined) {
      row = el("tr", { "data-testid": "call-row", "data-call-id": call.id });
      for (const column of CALL_COLUMNS) {
        const numeric = ["duration", "spend", "reserved"].includes(column);
        row.append(el("td", {
          class: numeric ? `num col-${column}` : `col-${column}`,
          "data-testid": `call-${column}`,
        }));
      }
      callRows.set(call.id, row);
    }
    const cells = row.children;
    const direction = call.direction ? ` (${str(call.direction)})` : "";
    setText(cells[0], call.id);
    setText(cells[1], str(call.tenant));
    setText(cells[2], `${str(call.provider)}${direction}`);
    setText(cells[3], str(call.brain));
    setText(cells[4], str(call.state));
    setText(cells[5], formatDuration(call.duration_s));
    setText(cells[6], formatUsd(call.spend));
    setText(cells[7], formatUsd(call.reserved));
    rows.push(row);
  }
  for (const [id, row] of callRows) {
    if (!seen.has(id)) {
      row.remove();
      callRows.delete(id);
    }
  }
  if (rows.length === 0) {
    body.replaceChildren(el("tr", { class: "empty" },
      el("td", { colspan: CALL_COLUMNS.length }, "No active calls")));
  } else {
    // replaceChildren moves the existing rows (no re-creation), keeping server order.
    body.replaceChildren(...rows);
  }
  setText($("active-count"), rows.length === 1 ? "1 call" : `${rows.length} calls`);
}

function budgetBlock(label, period, testid) {
  const spent = parseMicros(period?.spent);
  const reserved = parseMicros(period?.reserved);
  const budget = period?.budget === null || period?.budget === undefined
    ? null : parseMicros(period.budget);
  const block = el("div", { class: "budget", "data-testid": testid });
  const head = el("div", { class: "budget-head" },
    el("span", { class: "budget-label" }, label),
    el("span", { class: "budget-figures", "data-testid": `${testid}-figures` },
      budget === null
        ? `${formatUsd(period?.spent)} spent · no budget`
        : `${formatUsd(period?.spent)} of ${formatMicros(budget)}`));
  block.append(head);
  if (budget !== null && budget > 0n && spent !== null) {
    const spentBp = Math.min(basisPoints(spent, budget), 10000);
    const reservedBp = Math.min(basisPoints(reserved ?? 0n, budget), 10000 - spentBp);
    const usedBp = basisPoints(spent + (reserved ?? 0n), budget);
    const spentBar = el("span", { class: "meter-spent" });
    const reservedBar = el("span", { class: "meter-reserved" });
    // CSSOM (not a style attribute), so a strict Content-Security-Policy allows it.
    spentBar.style.width = `${spentBp / 100}%`;
    reservedBar.style.width = `${reservedBp / 100}%`;
    const level = usedBp >= 10000 ? "over" : usedBp >= 8000 ? "high" : "ok";
    block.append(el("div", {
      class: `meter meter-${level}`,
      role: "meter",
      "aria-valuemin": 0,
      "aria-valuemax": 100,
      "aria-valuenow": Math.floor(usedBp / 100),
      "data-testid": `${testid}-meter`,
      "data-used-bp": usedBp,
    }, spentBar, reservedBar));
    block.append(el("div", { class: "budget-foot muted small" },
      `${formatBasisPoints(usedBp)} used incl. ${formatUsd(period?.reserved)} reserved`));
  } else if (reserved !== null && reserved > 0n) {
    block.append(el("div", { class: "budget-foot muted small" },
      `${formatMicros(reserved)} reserved`));
  }
  return block;
}

/** Hand-drawn SVG: spend per hour as bars, the day budget (when set) as a dashed line. */
export function hourlyChart(byHour, budgetText) {
  const hours = asArray(byHour).slice(-CHART_HOURS);
  const amounts = hours.map((h) => parseMicros(h?.spent) ?? 0n);
  const budget = budgetText === null || budgetText === undefined ? null : parseMicros(budgetText);
  let scale = 0n;
  for (const a of amounts) if (a > scale) scale = a;
  if (budget !== null && budget > scale) scale = budget;
  const plotW = CHART_W - CHART_LEFT - CHART_RIGHT;
  const plotH = CHART_H - CHART_TOP - CHART_BOTTOM;
  const baseY = CHART_TOP + plotH;
  // Height of an amount in SVG units; the ratio is taken in integer parts-per-million first so
  // a huge amount cannot lose precision before it becomes a (display-only) coordinate.
  const yOf = (micros) => (scale === 0n ? baseY
    : baseY - (Number((micros * 1_000_000n) / scale) / 1_000_000) * plotH);
  const chart = svg("svg", {
    class: "chart",
    viewBox: `0 0 ${CHART_W} ${CHART_H}`,
    role: "img",
    "aria-label": "Spend per hour over the last 24 hours",
    "data-testid": "hourly-chart",
  });
  chart.append(svg("text", { x: CHART_LEFT - 6, y: CHART_TOP + 4, class: "axis-label", "text-anchor": "end" },
    formatMicros(scale)));
  chart.append(svg("text", { x: CHART_LEFT - 6, y: baseY, class: "axis-label", "text-anchor": "end" },
    "$0"));
  chart.append(svg("line", { x1: CHART_LEFT, x2: CHART_W - CHART_RIGHT, y1: CHART_TOP, y2: CHART_TOP, class: "grid" }));
  chart.append(svg("line", { x1: CHART_LEFT, x2: CHART_W - CHART_RIGHT, y1: baseY, y2: baseY, class: "axis" }));
  const slot = plotW / CHART_HOURS;
  // Right-align so the newest hour is always the last slot, even with fewer than 24 entries.
  const offset = CHART_HOURS - hours.length;
  hours.forEach((hour, i) => {
    const x = CHART_LEFT + (offset + i) * slot;
    const y = yOf(amounts[i]);
    const label = `${str(hour?.hour)}: ${formatMicros(amounts[i])}`;
    chart.append(svg("rect", {
      x: (x + slot * 0.15).toFixed(2),
      y: y.toFixed(2),
      width: (slot * 0.7).toFixed(2),
      height: Math.max(baseY - y, 0).toFixed(2),
      class: "bar",
      "data-testid": "hour-bar",
      "data-spent": formatMicros(amounts[i]),
    }, svg("title", {}, label)));
    if ((offset + i) % CHART_LABEL_EVERY === 0) {
      const hh = /T(\d{2})/.exec(str(hour?.hour, ""));
      chart.append(svg("text", { x: (x + slot / 2).toFixed(2), y: CHART_H - 6, class: "axis-label", "text-anchor": "middle" },
        hh === null ? "" : `${hh[1]}h`));
    }
  });
  if (budget !== null && budget > 0n) {
    const y = yOf(budget).toFixed(2);
    chart.append(svg("line", {
      x1: CHART_LEFT, x2: CHART_W - CHART_RIGHT, y1: y, y2: y,
      class: "budget-line", "data-testid": "budget-line",
    }, svg("title", {}, `day budget ${formatMicros(budget)}`)));
    chart.append(svg("text", { x: CHART_W - CHART_RIGHT, y: Number(y) - 3, class: "budget-label", "text-anchor": "end" },
      `day budget ${formatMicros(budget)}`));
  }
  return chart;
}

function renderTenants(tenants) {
  const grid = $("tenants");
  const seen = new Set();
  const cards = [];
  for (const tenant of tenants) {
    if (tenant === null || typeof tenant !== "object" || typeof tenant.id !== "string") continue;
    if (seen.has(tenant.id)) continue;
    seen.add(tenant.id);
    let card = tenantCards.get(tenant.id);
    if (card === undefined) {
      card = el("article", { class: "tenant-card", "data-testid": "tenant-card", "data-tenant": tenant.id });
      tenantCards.set(tenant.id, card);
    }
    card.replaceChildren(
      el("h3", { class: "tenant-name" }, tenant.id),
      budgetBlock("Today", tenant.today, "tenant-today"),
      budgetBlock("Month", tenant.month, "tenant-month"),
      hourlyChart(tenant.by_hour, tenant.today?.budget ?? null),
    );
    cards.push(card);
  }
  for (const [id, card] of tenantCards) {
    if (!seen.has(id)) {
      card.remove();
      tenantCards.delete(id);
    }
  }
  if (cards.length === 0) grid.replaceChildren(el("p", { class: "muted" }, "No tenants."));
  else grid.replaceChildren(...cards);
}

function renderList(listId, items, makeItem, emptyText) {
  const list = $(listId);
  const nodes = asArray(items).slice(0, MAX_LIST_ROWS)
    .filter((item) => item !== null && typeof item === "object")
    .map(makeItem);
  if (nodes.length === 0) list.replaceChildren(el("li", { class: "empty muted" }, emptyText));
  else list.replaceChildren(...nodes);
}

function refusalItem(refusal) {
  return el("li", { "data-testid": "refusal" },
    el("span", { class: "time" }, formatClock(refusal.at)),
    el("span", { class: "who" }, str(refusal.tenant)),
    el("span", { class: "reason badge badge-warn" }, str(refusal.reason)),
    refusal.caller ? el("span", { class: "muted" }, str(refusal.caller)) : null);
}

function endedItem(ended) {
  return el("li", { "data-testid": "ended-call", "data-call-id": str(ended.id, "") },
    el("span", { class: "time" }, formatClock(ended.at)),
    el("span", { class: "who mono" }, str(ended.id)),
    el("span", { class: "muted" }, str(ended.tenant)),
    el("span", { class: "reason badge" }, str(ended.reason)),
    el("span", { class: "num money" }, formatUsd(ended.spent)));
}

// ---------------------------------------------------------------------------------------------
// Kill switch (admin only): click, then a second click on an inline "confirm" button

const killSwitch = {
  engaged: null,     // server state from the last snapshot
  armedTarget: null, // the state a confirm click would request, while armed
  armTimer: null,
  pending: false,    // a PUT is in flight
  requested: null,   // state the last successful PUT asked for, until a snapshot shows it
  message: "",
};

function renderKillSwitch(isAdmin) {
  const area = $("kill-switch-area");
  if (!isAdmin || killSwitch.engaged === null) {
    area.replaceChildren();
    return;
  }
  const engaged = killSwitch.engaged;
  const toggle = el("button", {
    type: "button",
    class: engaged ? "kill engaged" : "kill",
    "data-testid": "kill-switch",
    "data-engaged": engaged ? "true" : "false",
    "aria-pressed": engaged ? "true" : "false",
    title: "The kill switch refuses every new call on every gateway",
    disabled: killSwitch.pending || killSwitch.armedTarget !== null,
  }, engaged ? "Kill switch ENGAGED" : "Kill switch off");
  toggle.addEventListener("click", armKillSwitch);
  const nodes = [toggle];
  if (killSwitch.armedTarget !== null) {
    const confirm = el("button", {
      type: "button",
      class: "confirm",
      "data-testid": "kill-switch-confirm",
      disabled: killSwitch.pending,
    }, killSwitch.armedTarget ? "Confirm: engage (refuse all new calls)" : "Confirm: release");
    confirm.addEventListener("click", confirmKillSwitch);
    const cancel = el("button", { type: "button", class: "ghost", "data-testid": "kill-switch-cancel" },
      "Cancel");
    cancel.addEventListener("click", disarmKillSwitch);
    nodes.push(confirm, cancel);
  }
  if (killSwitch.message !== "") {
    nodes.push(el("span", { class: "muted small", "data-testid": "kill-switch-status" }, killSwitch.message));
  }
  area.replaceChildren(...nodes);
}

function armKillSwitch() {
  if (killSwitch.engaged === null || killSwitch.pending) return;
  killSwitch.armedTarget = !killSwitch.engaged;
  killSwitch.message = "";
  clearTimeout(killSwitch.armTimer);
  killSwitch.armTimer = setTimeout(disarmKillSwitch, CONFIRM_TIMEOUT_MS);
  renderKillSwitch(true);
}

function disarmKillSwitch() {
  clearTimeout(killSwitch.armTimer);
  killSwitch.armTimer = null;
  killSwitch.armedTarget = null;
  renderKillSwitch(session !== null && session.role === "admin");
}

async function confirmKillSwitch() {
  const target = killSwitch.armedTarget;
  if (target === null || killSwitch.pending || session === null) return;
  const current = session;
  clearTimeout(killSwitch.armTimer);
  killSwitch.armedTarget = null;
  killSwitch.pending = true;
  killSwitch.message = target ? "engaging…" : "releasing…";
  renderKillSwitch(true);
  try {
    const response = await fetch(KILL_SWITCH_URL, {
      method: "PUT",
      headers: { ...authHeaders(current.key), "Content-Type": "application/json" },
      body: JSON.stringify({ engaged: target }),
      cache: "no-store",
    });
    if (response.status === 401) {
      endSession(`Key rejected: ${await errorMessage(response)}`);
      return;
    }
    if (!response.ok) {
      killSwitch.message = `Kill switch not changed: ${await errorMessage(response)}`;
    } else {
      // The server's word is the next snapshot; until then say what was asked.
      killSwitch.requested = target;
      killSwitch.message = `${target ? "engage" : "release"} sent; waiting for the server`;
    }
  } catch (error) {
    killSwitch.message = `Kill switch not changed: ${error instanceof Error ? error.message : error}`;
  } finally {
    killSwitch.pending = false;
  }
  if (session === current) renderKillSwitch(true);
}

function applyKillSwitchSnapshot(isAdmin, engaged) {
  const value = engaged === true;
  if (killSwitch.engaged !== null && killSwitch.engaged !== value && killSwitch.armedTarget !== null) {
    // The switch moved under an armed confirm (another operator): the armed action is stale.
    clearTimeout(killSwitch.armTimer);
    killSwitch.armedTarget = null;
  }
  killSwitch.engaged = value;
  if (killSwitch.requested !== null && killSwitch.requested === value) {
    killSwitch.requested = null;
    killSwitch.message = "";
  }
  renderKillSwitch(isAdmin);
}

function resetKillSwitch() {
  clearTimeout(killSwitch.armTimer);
  Object.assign(killSwitch, {
    engaged: null, armedTarget: null, armTimer: null, pending: false, requested: null, message: "",
  });
  $("kill-switch-area").replaceChildren();
}

// ---------------------------------------------------------------------------------------------
// Snapshot

let droppedEvents = 0;

function countDropped() {
  droppedEvents += 1;
  setText($("dropped-events"), String(droppedEvents));
}

/** Render one snapshot (already JSON-parsed). */
function renderSnapshot(snap) {
  const isAdmin = snap.role === "admin";
  if (session !== null) session.role = isAdmin ? "admin" : "tenant";
  setText($("role-badge"), isAdmin ? "admin" : `tenant ${str(snap.tenant)}`);
  $("role-badge").className = isAdmin ? "badge badge-admin" : "badge";
  setText($("snapshot-at"), snap.at ? `updated ${formatClock(snap.at)} UTC` : "");
  applyKillSwitchSnapshot(isAdmin, snap.kill_switch);
  $("kill-banner").hidden = snap.kill_switch !== true;
  renderTenants(asArray(snap.tenants));
  renderCalls(asArray(snap.active_calls));
  renderList("refusals", snap.recent_refusals, refusalItem, "No refusals.");
  renderList("ended", snap.recent_ended, endedItem, "No ended calls yet.");
}

function handleEvent(event) {
  if (event.type === "revoked") {
    // The server re-checks the key every 30 s and ends the feed when it is gone.
    endSession("This API key was revoked.");
    return false;
  }
  if (event.type !== "snapshot") return; // other event types may come later; ignore them
  let snap;
  try {
    snap = JSON.parse(event.data);
  } catch {
    countDropped();
    return false;
  }
  if (snap === null || typeof snap !== "object" || Array.isArray(snap)) {
    countDropped();
    return false;
  }
  renderSnapshot(snap);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Session: login, the live stream, reconnects, logout

/** The open session, or null on the login screen. */
let session = null;

class AuthError extends Error {}

function authHeaders(key) {
  return { Authorization: `Bearer ${key}` };
}

/** The server's error message from a JSON error body, else the HTTP status. */
async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && typeof body.error?.message === "string") {
      return `${body.error.message} (HTTP ${response.status})`;
    }
  } catch {
    // not JSON: fall through
  }
  return `HTTP ${response.status}`;
}

function setConnectionState(state) {
  const node = $("connection-state");
  node.dataset.state = state;
  setText(node, state);
}

function backoffDelay(attempt, retryMs) {
  const base = Math.max(RECONNECT_INITIAL_MS, retryMs ?? 0);
  const delay = Math.min(base * 2 ** attempt, RECONNECT_MAX_MS);
  const jitter = 1 + (Math.random() * 2 - 1) * RECONNECT_JITTER;
  return Math.round(delay * jitter);
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

/** Read one connection of the events stream until it ends; true if it delivered a snapshot. */
async function readStream(current, parser) {
  const connection = new AbortController();
  const stop = () => connection.abort();
  current.abort.signal.addEventListener("abort", stop, { once: true });
  let lastByteAt = performance.now();
  const watchdog = setInterval(() => {
    if (performance.now() - lastByteAt > STALE_STREAM_MS) connection.abort();
  }, WATCHDOG_INTERVAL_MS);
  let delivered = false;
  try {
    const response = await fetch(EVENTS_URL, {
      headers: { ...authHeaders(current.key), Accept: "text/event-stream" },
      cache: "no-store",
      signal: connection.signal,
    });
    if (response.status === 401 || response.status === 403) {
      throw new AuthError(await errorMessage(response));
    }
    if (!response.ok || response.body === null) throw new Error(`HTTP ${response.status}`);
    const reader = response.body.getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done || current.abort.signal.aborted) break;
      lastByteAt = performance.now();
      const oversizedBefore = parser.oversizedLines;
      const events = parser.push(value);
      for (let i = oversizedBefore; i < parser.oversizedLines; i++) countDropped();
      for (const event of events) {
        if (session !== current) return delivered;
        if (handleEvent(event) === true) {
          delivered = true;
          setConnectionState("live");
        }
      }
    }
  } catch (error) {
    if (error instanceof AuthError) throw error;
    // network error, abort by the watchdog, HTTP error: reconnect
  } finally {
    clearInterval(watchdog);
    current.abort.signal.removeEventListener("abort", stop);
    connection.abort();
  }
  return delivered;
}

async function runSession(current) {
  let attempt = 0;
  while (session === current) {
    setConnectionState("reconnecting");
    const parser = new SseParser();
    let delivered;
    try {
      delivered = await readStream(current, parser);
    } catch (error) {
      if (session === current) endSession(`Key rejected: ${error.message}`);
      return;
    }
    if (session !== current) return;
    setConnectionState("reconnecting");
    attempt = delivered ? 0 : attempt + 1;
    await sleep(backoffDelay(attempt, parser.retryMs), current.abort.signal);
  }
}

function startSession(key) {
  session = { key, role: null, abort: new AbortController() };
  $("login-view").hidden = true;
  $("session-bar").hidden = false;
  $("dashboard-view").hidden = false;
  setText($("login-message"), "");
  runSession(session);
}

/** Back to the login form (optionally with a message); forgets the key. */
function endSession(message = "") {
  if (session !== null) session.abort.abort();
  session = null;
  sessionStorage.removeItem(SESSION_KEY);
  resetKillSwitch();
  $("kill-banner").hidden = true;
  callRows.clear();
  tenantCards.clear();
  $("active-calls-body").replaceChildren();
  $("tenants").replaceChildren();
  $("refusals").replaceChildren();
  $("ended").replaceChildren();
  setText($("role-badge"), "");
  setText($("snapshot-at"), "");
  setConnectionState("reconnecting");
  $("dashboard-view").hidden = true;
  $("session-bar").hidden = true;
  $("login-view").hidden = false;
  setText($("login-message"), message);
  $("login-key").value = "";
  $("login-key").focus();
}

function init() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("login-key").value.trim();
    if (key === "") {
      setText($("login-message"), "Enter an API key.");
      return;
    }
    sessionStorage.setItem(SESSION_KEY, key);
    $("login-key").value = "";
    startSession(key);
  });
  $("logout").addEventListener("click", () => endSession("Logged out."));
  const saved = sessionStorage.getItem(SESSION_KEY);
  if (saved) startSession(saved);
  else $("login-key").focus();
}

// Importing this module elsewhere (e.g. a test importing the helpers) must not start a second
// dashboard; module scripts run once per page anyway, the guard covers non-dashboard pages.
if (document.getElementById("login-form") !== null) init();
