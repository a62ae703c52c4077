// The rutster softphone: the browser as a phone, on Twilio's Media Streams wire.
//
// Call: POST /phone/calls with the key (the gateway admits the call and answers the
// socket URL and the stream's parameters), open the microphone, capture 20 ms frames
// of 8 kHz mu-law in an AudioWorklet (capture-worklet.js) and send them as "media";
// play the gateway's "media" in order, echo each "mark" once the audio before it has
// played, and on "clear" (barge-in) stop everything scheduled and echo the marks
// behind it, as Twilio does. The live view polls GET /v1/calls/{id} for spend and
// receipts; the state shown is what this page sees: speaking (assistant audio
// playing), interrupted (a clear just came), listening (the microphone hears you),
// thinking (neither).
"use strict";

const MIC_SPEECH_RMS = 0.01; // about -40 dBFS: the microphone hears someone
const INTERRUPTED_SHOW_MS = 1000;
const POLL_MS = 1000;

const $ = (id) => document.getElementById(id);
// Counters the browser tests read.
const stats = { sent: 0, received: 0, marks: 0, clears: 0, state: "idle", calls: 0, ended: 0 };
window.rutsterPhone = stats;

let ws = null;
let ctx = null;
let micStream = null;
let worklet = null;
let playHead = 0;
let sources = [];
let pendingMarks = []; // [{name, timer}]
let pollTimer = null;
let callId = null;
let streamSid = null;
let lastClear = 0;
let micLevel = 0;
let ending = false;

function setState(state) {
  stats.state = state;
  const el = $("state");
  el.textContent = state;
  el.dataset.state = state;
}

function showError(text) {
  $("error").textContent = text;
}

function mulawToFloat(byte) {
  const u = ~byte & 0xff;
  const sign = u & 0x80;
  const exponent = (u >> 4) & 0x07;
  const mantissa = u & 0x0f;
  let magnitude = ((mantissa << 3) + 0x84) << exponent;
  magnitude -= 0x84;
  return (sign ? -magnitude : magnitude) / 32768;
}

function base64ToBytes(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

function bytesToBase64(bytes) {
  let raw = "";
  for (let i = 0; i < bytes.length; i++) raw += String.fromCharCode(bytes[i]);
  return btoa(raw);
}

function send(message) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message));
}

function echoMark(name) {
  send({ event: "mark", streamSid, mark: { name } });
  stats.marks++;
}

function play(mulaw) {
  const samples = new Float32Array(mulaw.length);
  for (let i = 0; i < mulaw.length; i++) samples[i] = mulawToFloat(mulaw[i]);
  const buffer = ctx.createBuffer(1, samples.length, 8000);
  buffer.copyToChannel(samples, 0);
  const source = ctx.createBufferSource();
  source.buffer = buffer;
  source.connect(ctx.destination);
  playHead = Math.max(playHead, ctx.currentTime);
  source.start(playHead);
  playHead += buffer.duration;
  sources.push(source);
  source.onended = () => {
    sources = sources.filter((s) => s !== source);
  };
}

function onMessage(event) {
  let message;
  try {
    message = JSON.parse(event.data);
  } catch {
    return;
  }
  if (message.event === "media") {
    stats.received++;
    play(base64ToBytes(message.media.payload));
  } else if (message.event === "mark") {
    const name = message.mark.name;
    const delayMs = Math.max(0, (playHead - ctx.currentTime) * 1000);
    const entry = { name, timer: null };
    entry.timer = setTimeout(() => {
      pendingMarks = pendingMarks.filter((m) => m !== entry);
      echoMark(name);
    }, delayMs);
    pendingMarks.push(entry);
  } else if (message.event === "clear") {
    stats.clears++;
    lastClear = performance.now();
    for (const source of sources) source.stop();
    sources = [];
    playHead = ctx.currentTime;
    for (const mark of pendingMarks) {
      clearTimeout(mark.timer);
      echoMark(mark.name);
    }
    pendingMarks = [];
  }
}

function refreshState() {
  if (!ws) return;
  $("frames").textContent = `${stats.received} / ${stats.sent}`;
  if (performance.now() - lastClear < INTERRUPTED_SHOW_MS) setState("interrupted");
  else if (ctx && playHead > ctx.currentTime) setState("speaking");
  else if (micLevel > MIC_SPEECH_RMS) setState("listening");
  else setState("thinking");
}

async function poll(id = callId) {
  if (!id) return;
  try {
    const response = await fetch(`/v1/calls/${encodeURIComponent(id)}`, {
      headers: { Authorization: `Bearer ${$("key").value.trim()}` },
    });
    if (!response.ok) return;
    const call = await response.json();
    $("spent").textContent = call.spend ? `$${call.spend.settled ?? call.spend.cost}` : "–";
    $("reserved").textContent = call.spend ? `$${call.spend.reserved}` : "–";
    const list = $("receipts");
    list.replaceChildren(
      ...(call.receipts || []).map((r) => {
        const item = document.createElement("li");
        item.textContent = [r.stage, r.type, r.tool, r.status, r.reason]
          .filter(Boolean)
          .join(" ");
        return item;
      }),
    );
    if (call.status === "ended" && id === callId) endCall("the call ended");
  } catch {
    // The next poll tries again.
  }
}

async function startCall() {
  showError("");
  const key = $("key").value.trim();
  if (!key) {
    showError("give an API key first");
    return;
  }
  sessionStorage.setItem("rutster-phone-key", key);
  $("call").disabled = true;
  // Made in the click itself: a context made after an await may start suspended
  // (browsers' autoplay policy wants a user gesture).
  ctx = new AudioContext();
  let call;
  try {
    const response = await fetch("/phone/calls", {
      method: "POST",
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
      body: "{}",
    });
    call = await response.json();
    if (!response.ok) throw new Error(call.error ? call.error.code || call.error.message : response.status);
  } catch (error) {
    showError(`the gateway refused the call: ${error.message}`);
    $("call").disabled = false;
    await ctx.close();
    ctx = null;
    return;
  }
  callId = call.call_id;
  stats.calls++;
  streamSid = "MZ" + call.call_sid.slice(2);
  $("call-id").textContent = callId;
  try {
    await ctx.resume();
    await ctx.audioWorklet.addModule("/phone/static/capture-worklet.js");
    micStream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: false, autoGainControl: false },
    });
  } catch (error) {
    showError(`no microphone: ${error.message}`);
    await endCall("no microphone");
    return;
  }
  const mic = ctx.createMediaStreamSource(micStream);
  worklet = new AudioWorkletNode(ctx, "capture-8k", { processorOptions: { rate: ctx.sampleRate } });
  mic.connect(worklet);
  const url = new URL(call.stream_url, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  ws = new WebSocket(url);
  ws.onopen = () => {
    send({ event: "connected", protocol: "Call", version: "1.0.0" });
    send({
      event: "start",
      sequenceNumber: "1",
      streamSid,
      start: {
        accountSid: "browser",
        streamSid,
        callSid: call.call_sid,
        tracks: ["inbound"],
        mediaFormat: { encoding: "audio/x-mulaw", sampleRate: 8000, channels: 1 },
        customParameters: call.parameters,
      },
    });
    let chunk = 0;
    worklet.port.onmessage = (e) => {
      micLevel = e.data.rms;
      chunk++;
      send({
        event: "media",
        sequenceNumber: String(chunk + 1),
        streamSid,
        media: { track: "inbound", chunk: String(chunk), timestamp: String(chunk * 20), payload: bytesToBase64(e.data.mulaw) },
      });
      stats.sent++;
    };
    $("hangup").disabled = false;
    setState("listening");
  };
  ws.onmessage = onMessage;
  ws.onclose = () => endCall("the gateway closed the call");
  pollTimer = setInterval(() => {
    refreshState();
  }, 100);
  setTimeout(function again() {
    if (!callId) return;
    poll().finally(() => setTimeout(again, POLL_MS));
  }, POLL_MS);
}

async function endCall(reason) {
  if (ending || !callId) return;
  ending = true;
  if (ws && ws.readyState === WebSocket.OPEN) {
    send({ event: "stop", streamSid, stop: { accountSid: "browser", callSid: streamSid } });
    ws.close(1000, "caller hung up");
  }
  ws = null;
  if (micStream) micStream.getTracks().forEach((t) => t.stop());
  if (worklet) worklet.port.onmessage = null;
  for (const mark of pendingMarks) clearTimeout(mark.timer);
  pendingMarks = [];
  clearInterval(pollTimer);
  const finalPoll = callId;
  setTimeout(() => poll(finalPoll), 1500); // the settled spend, once the gateway has settled
  callId = null;
  if (ctx) await ctx.close();
  ctx = null;
  setState("ended");
  $("hangup").disabled = true;
  $("call").disabled = false;
  if (reason) $("error").textContent = reason;
  stats.ended++;
  ending = false;
}

document.addEventListener("DOMContentLoaded", () => {
  $("key").value = sessionStorage.getItem("rutster-phone-key") || "";
  $("call").addEventListener("click", startCall);
  $("hangup").addEventListener("click", () => endCall("you hung up"));
});
