// The softphone's microphone capture: the AudioContext's rate in, 20 ms frames of
// 8 kHz G.711 mu-law out (160 bytes each), plus each frame's RMS level, posted to the page.
// Downsampling averages the input over each output sample's span (a box filter: the
// phone line's own band limit is what the gateway hears next, so a plain anti-alias
// average is enough here).

const FRAME = 160; // 20 ms at 8 kHz

function linearToMulaw(sample) {
  // ITU-T G.711 mu-law, from a float in [-1, 1].
  const BIAS = 0x84;
  const CLIP = 32635;
  let pcm = Math.max(-32768, Math.min(32767, Math.round(sample * 32767)));
  const sign = pcm < 0 ? 0x80 : 0;
  if (pcm < 0) pcm = -pcm;
  if (pcm > CLIP) pcm = CLIP;
  pcm += BIAS;
  let exponent = 7;
  for (let mask = 0x4000; (pcm & mask) === 0 && exponent > 0; mask >>= 1) exponent--;
  const mantissa = (pcm >> (exponent + 3)) & 0x0f;
  return ~(sign | (exponent << 4) | mantissa) & 0xff;
}

class Capture8k extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.step = options.processorOptions.rate / 8000; // input samples per output sample
    this.acc = 0;
    this.count = 0;
    this.pos = 0;
    this.frame = new Uint8Array(FRAME);
    this.fill = 0;
    this.energy = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    for (let i = 0; i < channel.length; i++) {
      this.acc += channel[i];
      this.count++;
      this.pos++;
      if (this.pos >= this.step) {
        this.pos -= this.step;
        const sample = this.acc / this.count;
        this.acc = 0;
        this.count = 0;
        this.energy += sample * sample;
        this.frame[this.fill++] = linearToMulaw(sample);
        if (this.fill === FRAME) {
          this.port.postMessage({ mulaw: this.frame.slice(), rms: Math.sqrt(this.energy / FRAME) });
          this.fill = 0;
          this.energy = 0;
        }
      }
    }
    return true;
  }
}

registerProcessor("capture-8k", Capture8k);
