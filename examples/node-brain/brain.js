// An example rutster brain in Node.js, speaking the tap protocol v1.
//
// The contract is docs/TAP_PROTOCOL.md in the rutster repository; this file
// needs nothing else. The core (the gateway) dials this brain over WebSocket,
// one connection per call. Per connection the brain:
//   - answers the core's `hello` with its own `hello` and a `tools.update`
//     catalog holding one tool, `hangup`;
//   - buffers the caller's audio of the current turn (at most MAX_TURN_MS);
//   - on `speech_stopped` plays that turn back as `audio_out` (item
//     `node-turn-N`), or, if the turn contained the marker tone, proposes
//     `function_call` hangup instead;
//   - stops the item the core names in `speech_started{interrupted:true}`;
//   - counts and ignores unknown types and malformed messages (never crashes);
//   - on `session_end` sends `bye` and closes.
//
// Run: `npm ci && node brain.js` (address from RUTSTER_BRAIN_BIND).

import http from "node:http";
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { WebSocket, WebSocketServer } from "ws";

// ---- protocol constants (docs/TAP_PROTOCOL.md) ----------------------------------

/** Protocol version in every envelope's `v`. */
const TAP_VERSION = 1;
/** Largest frame either peer accepts (128 KiB), passed to ws as maxPayload. */
const MAX_MESSAGE_BYTES = 128 * 1024;
/** Longest `type` string a peer accepts. */
const MAX_TYPE_CHARS = 64;
/** Canonical audio: PCM s16le mono 24 kHz, 480-sample (20 ms) `audio_in`. */
const SAMPLE_RATE = 24000;
const BYTES_PER_SAMPLE = 2;
const AUDIO_IN_SAMPLES = 480;
/** Standard padded base64 (RFC 4648 §4), as `pcm` must be. */
const STRICT_BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

// ---- this brain's choices --------------------------------------------------------

/** Where to listen when RUTSTER_BRAIN_BIND is unset (port 8083: echo is 8081). */
const DEFAULT_BIND = "ws://127.0.0.1:8083/node";
const BIND_ENV = "RUTSTER_BRAIN_BIND";
const DEFAULT_PORT = 8083;
const DEFAULT_PATH = "/node";
/** Name in the brain's `hello`. */
const BRAIN_NAME = "node-example";
/** Longest caller turn kept for playback; more is dropped (bounded memory). */
const MAX_TURN_MS = 10_000;
const MAX_TURN_BYTES = (SAMPLE_RATE * MAX_TURN_MS / 1000) * BYTES_PER_SAMPLE;
/** Playback chunk: 100 ms per `audio_out` (the protocol allows up to 1 s). */
const CHUNK_MS = 100;
const CHUNK_BYTES = (SAMPLE_RATE * CHUNK_MS / 1000) * BYTES_PER_SAMPLE;
/** Chunks go out 1.25x faster than real time: the core buffers and paces
 * playout itself, and a small lead keeps its buffer from running dry. */
const PLAYBACK_SPEEDUP = 1.25;
const CHUNK_INTERVAL_MS = CHUNK_MS / PLAYBACK_SPEEDUP;
/** Warnings logged per kind and connection before going quiet (log floods). */
const WARN_BURST = 5;
/** On SIGTERM/SIGINT, connections get this long to close before we exit. */
const SHUTDOWN_GRACE_MS = 2000;

/** The one tool: the core validates every `function_call` against this. */
const HANGUP_TOOL = {
  name: "hangup",
  description: "End the call.",
  parameters: {
    type: "object",
    properties: { reason: { type: "string", description: "why the call ends" } },
    required: ["reason"],
    additionalProperties: false,
  },
};

// ---- marker tone detection -------------------------------------------------------
// Ported from tools/marker_tone.py (same constants, same Goertzel): a test
// caller plays a steady 2000 Hz tone to make a scripted brain call a tool.

/** Tone frequency (tools/marker_tone.py MARKER_TONE_HZ). */
const MARKER_TONE_HZ = 2000;
/** Detection frame, 20 ms (DETECT_FRAME_SAMPLES). */
const DETECT_FRAME_SAMPLES = 480;
/** Share of a frame's energy at the tone frequency (DETECT_MIN_TONE_SHARE). */
const DETECT_MIN_TONE_SHARE = 0.6;
/** Tone frames in a row needed, 200 ms (DETECT_MIN_FRAMES). */
const DETECT_MIN_FRAMES = 10;
/** Quieter frames (RMS in s16 units, about -50 dBFS) are never tone (DETECT_MIN_RMS). */
const DETECT_MIN_RMS = 100;

/** Whether one frame of s16le samples at `offset` is marker tone. */
function frameIsTone(data, offset, n) {
  const k = Math.round((n * MARKER_TONE_HZ) / SAMPLE_RATE);
  const coeff = 2 * Math.cos((2 * Math.PI * k) / n);
  let s1 = 0;
  let s2 = 0;
  let energy = 0;
  for (let i = 0; i < n; i++) {
    const x = data.readInt16LE(offset + i * BYTES_PER_SAMPLE);
    const s = x + coeff * s1 - s2;
    s2 = s1;
    s1 = s;
    energy += x * x;
  }
  if (Math.sqrt(energy / n) < DETECT_MIN_RMS) return false;
  const power = s2 * s2 + s1 * s1 - coeff * s1 * s2;
  const total = (energy * n) / 2;
  const share = total <= 0 ? 0 : Math.min(1, power / total);
  return share >= DETECT_MIN_TONE_SHARE;
}

/** Streaming detector: feed PCM chunks; `detected` sticks until reset(). */
class MarkerToneDetector {
  constructor() {
    this.reset();
  }

  reset() {
    this.pending = Buffer.alloc(0);
    this.run = 0;
    this.detected = false;
  }

  feed(pcm) {
    if (this.detected) return true;
    const data = this.pending.length ? Buffer.concat([this.pending, pcm]) : pcm;
    const frameBytes = DETECT_FRAME_SAMPLES * BYTES_PER_SAMPLE;
    let offset = 0;
    for (; offset + frameBytes <= data.length; offset += frameBytes) {
      if (frameIsTone(data, offset, DETECT_FRAME_SAMPLES)) {
        this.run += 1;
        if (this.run >= DETECT_MIN_FRAMES) {
          this.detected = true;
          break;
        }
      } else {
        this.run = 0;
      }
    }
    this.pending = Buffer.from(data.subarray(offset));
    return this.detected;
  }
}

// ---- helpers ---------------------------------------------------------------------

function log(message) {
  console.error(`node brain: ${message}`);
}

function packageVersion() {
  try {
    const text = readFileSync(new URL("./package.json", import.meta.url), "utf8");
    return String(JSON.parse(text).version);
  } catch {
    return "0.0.0";
  }
}

/**
 * Parse the bind address: `ws://host:port/path`, `host:port`, `:port` or
 * `[::1]:port`. A missing path is /node; a missing port is 8083 (so an
 * explicit :80, the ws:// default, is not expressible: brains never use it).
 */
function parseBind(value) {
  let text = (value ?? "").trim() || DEFAULT_BIND;
  if (text.startsWith(":")) text = `127.0.0.1${text}`;
  if (!text.includes("://")) text = `ws://${text}`;
  let url;
  try {
    url = new URL(text);
  } catch {
    throw new Error(`bad bind address ${JSON.stringify(value)}: use ws://host:port/path`);
  }
  if (url.protocol !== "ws:") {
    throw new Error(`bad bind address ${JSON.stringify(value)}: scheme must be ws://`);
  }
  if (url.username || url.password || url.search || url.hash) {
    throw new Error(`bad bind address ${JSON.stringify(value)}: no credentials, query or fragment`);
  }
  const host = url.hostname.replace(/^\[(.*)\]$/, "$1");
  const port = url.port === "" ? DEFAULT_PORT : Number(url.port);
  const path = url.pathname === "" || url.pathname === "/" ? DEFAULT_PATH : url.pathname;
  return { host, port, path };
}

function formatUrl(host, port, path) {
  return `ws://${host.includes(":") ? `[${host}]` : host}:${port}${path}`;
}

/** The envelope's problem as a short reason label, or null if it is fine. */
function envelopeProblem(msg) {
  if (msg === null || typeof msg !== "object" || Array.isArray(msg)) return "not_an_object";
  if (!Number.isInteger(msg.v)) return "bad_envelope";
  if (msg.v !== TAP_VERSION) return "bad_version";
  if (typeof msg.type !== "string" || msg.type.length < 1 || msg.type.length > MAX_TYPE_CHARS) {
    return "bad_envelope";
  }
  if (!Number.isInteger(msg.seq) || msg.seq < 0) return "bad_envelope";
  if (typeof msg.ts !== "number" || !Number.isFinite(msg.ts)) return "bad_envelope";
  return null;
}

/** Thrown for a message the brain drops; `reason` is a short stable label. */
class BadMessage extends Error {
  constructor(reason, message) {
    super(message);
    this.reason = reason;
  }
}

function decodeAudioIn(msg) {
  if (msg.samples !== AUDIO_IN_SAMPLES) {
    throw new BadMessage("bad_audio_length", `audio_in samples=${msg.samples}`);
  }
  if (typeof msg.pcm !== "string" || !STRICT_BASE64.test(msg.pcm)) {
    throw new BadMessage("bad_base64", "audio_in pcm is not standard base64");
  }
  const pcm = Buffer.from(msg.pcm, "base64");
  if (pcm.length !== AUDIO_IN_SAMPLES * BYTES_PER_SAMPLE) {
    throw new BadMessage("bad_audio_length", `audio_in pcm holds ${pcm.length} bytes`);
  }
  return pcm;
}

function checkHello(msg) {
  const audio = msg.audio;
  if (typeof msg.session_id !== "string" || msg.session_id === "") {
    throw new BadMessage("bad_field", "hello session_id must be a non-empty string");
  }
  if (typeof msg.resume !== "boolean") throw new BadMessage("bad_field", "hello resume");
  if (msg.call === null || typeof msg.call !== "object") {
    throw new BadMessage("bad_field", "hello call must be an object");
  }
  if (
    audio === null ||
    typeof audio !== "object" ||
    audio.format !== "pcm_s16le" ||
    audio.sample_rate !== SAMPLE_RATE ||
    audio.channels !== 1 ||
    audio.frame_samples !== AUDIO_IN_SAMPLES
  ) {
    throw new BadMessage("unsupported_audio", "hello audio is not the v1 format");
  }
}

// ---- one connection (one call) ---------------------------------------------------

let connectionCount = 0;
const VERSION = packageVersion();

class Session {
  constructor(ws) {
    connectionCount += 1;
    this.ws = ws;
    this.label = `#${connectionCount}`;
    this.startMs = performance.now();
    this.outSeq = 0;
    this.lastInSeq = null;
    this.inSeqGaps = 0;
    this.sessionId = null;
    this.turn = [];
    this.turnBytes = 0;
    this.droppedTurnBytes = 0;
    this.detector = new MarkerToneDetector();
    this.answers = 0;
    this.calls = 0;
    this.playback = null;
    this.unknownEvents = 0;
    this.badMessages = 0;
    this.warnings = new Map();
  }

  warn(kind, message) {
    const count = (this.warnings.get(kind) ?? 0) + 1;
    this.warnings.set(kind, count);
    if (count <= WARN_BURST) log(`${this.label} ${message}`);
    if (count === WARN_BURST) log(`${this.label} (further ${kind} warnings suppressed)`);
  }

  /** Send one tap message; seq counts from 0 per connection, ts is ms since it opened. */
  send(type, fields = {}) {
    if (this.ws.readyState !== WebSocket.OPEN) return false;
    const envelope = {
      v: TAP_VERSION,
      type,
      seq: this.outSeq,
      ts: Math.round(performance.now() - this.startMs),
    };
    this.outSeq += 1;
    this.ws.send(JSON.stringify({ ...envelope, ...fields }), (err) => {
      if (err) this.warn("send", `send ${type} failed: ${err.message}`);
    });
    return true;
  }

  onMessage(data, isBinary) {
    let msg;
    try {
      // Binary frames are read as UTF-8 text too, as our Python decoder does.
      msg = JSON.parse(Buffer.isBuffer(data) ? data.toString("utf8") : String(data));
    } catch {
      this.badMessages += 1;
      this.warn("bad", `dropped malformed JSON${isBinary ? " (binary frame)" : ""}`);
      return;
    }
    const problem = envelopeProblem(msg);
    if (problem) {
      this.badMessages += 1;
      this.warn("bad", `dropped message (${problem})`);
      return;
    }
    const expected = this.lastInSeq === null ? 0 : this.lastInSeq + 1;
    if (msg.seq !== expected) this.inSeqGaps += 1;
    this.lastInSeq = msg.seq;
    try {
      this.dispatch(msg);
    } catch (err) {
      this.badMessages += 1;
      const reason = err instanceof BadMessage ? err.reason : "internal";
      this.warn("bad", `dropped ${msg.type} (${reason}): ${err.message}`);
    }
  }

  dispatch(msg) {
    switch (msg.type) {
      case "hello":
        return this.onHello(msg);
      case "audio_in":
        return this.onAudioIn(msg);
      case "speech_started":
        return this.onSpeechStarted(msg);
      case "speech_stopped":
        return this.onSpeechStopped();
      case "dtmf":
        log(`${this.label} dtmf ${JSON.stringify(msg.digit)}`);
        return undefined;
      case "function_call_output":
        log(`${this.label} function_call_output ${JSON.stringify(msg.id)}: ${msg.status}`);
        return undefined;
      case "session_end":
        return this.onSessionEnd(msg);
      default:
        // Forward compatibility (TAP_PROTOCOL.md): count, log, drop; never close.
        this.unknownEvents += 1;
        this.warn("unknown", `ignored unknown event ${JSON.stringify(msg.type.slice(0, 32))}`);
        return undefined;
    }
  }

  onHello(msg) {
    checkHello(msg);
    this.sessionId = msg.session_id;
    log(`${this.label} session ${msg.session_id} ${msg.resume ? "resumed" : "started"}`);
    this.send("hello", { brain: { name: BRAIN_NAME, version: VERSION } });
    this.send("tools.update", { tools: [HANGUP_TOOL] });
  }

  onAudioIn(msg) {
    if (this.sessionId === null) throw new BadMessage("no_hello", "audio_in before hello");
    const pcm = decodeAudioIn(msg);
    if (this.turnBytes + pcm.length <= MAX_TURN_BYTES) {
      this.turn.push(pcm);
      this.turnBytes += pcm.length;
    } else {
      this.droppedTurnBytes += pcm.length;
    }
    this.detector.feed(pcm);
  }

  onSpeechStarted(msg) {
    if (typeof msg.interrupted !== "boolean") {
      throw new BadMessage("bad_field", "speech_started interrupted must be a boolean");
    }
    if (msg.interrupted && this.playback) {
      const item = msg.item ?? null;
      if (item === null || item === this.playback.item) {
        this.stopPlayback(`barge-in after ${msg.played_ms ?? "?"} ms heard`);
      }
    }
    this.resetTurn(); // the caller's new turn starts here
  }

  onSpeechStopped() {
    const toneHeard = this.detector.detected;
    const pcm = Buffer.concat(this.turn);
    if (this.droppedTurnBytes) {
      log(`${this.label} turn over ${MAX_TURN_MS} ms: kept the first ${MAX_TURN_MS} ms`);
    }
    this.resetTurn();
    if (toneHeard) {
      this.calls += 1;
      const id = `node-call-${this.calls}`;
      log(`${this.label} marker tone heard: proposing hangup (${id})`);
      this.send("function_call", { id, name: "hangup", args: { reason: "marker tone" } });
    } else if (pcm.length > 0) {
      this.startPlayback(pcm);
    }
  }

  onSessionEnd(msg) {
    log(`${this.label} session ended (${msg.reason})`);
    this.stopPlayback("session ended");
    this.send("bye", { reason: "session_end" });
    this.ws.close(1000, "session ended");
  }

  resetTurn() {
    this.turn = [];
    this.turnBytes = 0;
    this.droppedTurnBytes = 0;
    this.detector.reset();
  }

  startPlayback(pcm) {
    this.stopPlayback("superseded by a new answer");
    this.answers += 1;
    const playback = { item: `node-turn-${this.answers}`, pcm, offset: 0, timer: null };
    this.playback = playback;
    const tick = () => {
      if (this.playback !== playback) return;
      const chunk = pcm.subarray(playback.offset, playback.offset + CHUNK_BYTES);
      playback.offset += chunk.length;
      this.send("audio_out", {
        pcm: chunk.toString("base64"),
        samples: chunk.length / BYTES_PER_SAMPLE,
        item: playback.item,
      });
      if (playback.offset >= pcm.length) {
        this.playback = null;
        return;
      }
      playback.timer = setTimeout(tick, CHUNK_INTERVAL_MS);
    };
    tick();
  }

  stopPlayback(why) {
    const playback = this.playback;
    if (!playback) return;
    clearTimeout(playback.timer);
    this.playback = null;
    log(`${this.label} stopped ${playback.item}: ${why}`);
  }

  onClose(code) {
    this.stopPlayback("connection closed");
    log(
      `${this.label} closed (code ${code}): ${this.unknownEvents} unknown events, ` +
        `${this.badMessages} bad messages, ${this.inSeqGaps} seq gaps`,
    );
  }
}

// ---- the server ------------------------------------------------------------------

function main() {
  let bind;
  try {
    bind = parseBind(process.env[BIND_ENV]);
  } catch (err) {
    log(err.message);
    process.exit(2);
  }

  const server = http.createServer((req, res) => {
    res.writeHead(426, { "Content-Type": "text/plain" });
    res.end("this is a tap brain: connect with WebSocket\n");
  });
  const wss = new WebSocketServer({
    noServer: true,
    maxPayload: MAX_MESSAGE_BYTES, // bigger frames close with 1009 (TAP_PROTOCOL.md)
    perMessageDeflate: false, // base64 PCM barely compresses; deflate costs CPU
  });
  const sessions = new Set();

  server.on("upgrade", (req, socket, head) => {
    socket.on("error", () => {});
    const path = new URL(req.url ?? "/", "http://brain").pathname;
    if (path !== bind.path) {
      socket.end("HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 10\r\n\r\nnot found\n");
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => wss.emit("connection", ws, req));
  });

  wss.on("connection", (ws) => {
    const session = new Session(ws);
    sessions.add(session);
    ws.on("message", (data, isBinary) => session.onMessage(data, isBinary));
    ws.on("error", (err) => session.warn("socket", `socket error: ${err.message}`));
    ws.on("close", (code) => {
      sessions.delete(session);
      session.onClose(code);
    });
  });

  server.on("error", (err) => {
    log(`cannot listen on ${formatUrl(bind.host, bind.port, bind.path)}: ${err.message}`);
    process.exit(1);
  });

  server.listen(bind.port, bind.host, () => {
    const { port } = server.address();
    console.log(`node brain listening on ${formatUrl(bind.host, port, bind.path)}`);
  });

  let stopping = false;
  const shutdown = (signal) => {
    if (stopping) return;
    stopping = true;
    log(`${signal}: closing ${sessions.size} connection(s)`);
    for (const session of sessions) {
      session.stopPlayback("shutting down");
      session.send("bye", { reason: "shutdown" });
      session.ws.close(1001, "brain shutting down");
    }
    wss.close();
    server.close(() => {
      log("stopped");
      process.exit(0);
    });
    setTimeout(() => {
      for (const session of sessions) session.ws.terminate();
      log("stopped (forced)");
      process.exit(0);
    }, SHUTDOWN_GRACE_MS).unref();
  };
  process.on("SIGTERM", () => shutdown("SIGTERM"));
  process.on("SIGINT", () => shutdown("SIGINT"));
}

main();
