// Overload (issue 12): drives a served cluster at its capacity and then at ten times it —
// closed loop, open loop, and clients that read slowly or never — and reports, per phase,
// how requests ended and the front node's resident memory (its admin /metrics:
// process_resident_memory_bytes, sampled every 100 ms), then checks the node recovers: after
// the load, a request is served and memory falls back toward where it was.
//
// The baseline in the same run is the first phase (1x capacity, closed loop): every other
// phase's memory is printed as a ratio to it, and against the bound the manifest's limits
// imply (docs/reliability.md "Memory under overload" derives it; pass its inputs).
//
//   node bench/overload.mjs --base-url http://127.0.0.1:8000 --metrics-url http://127.0.0.1:17200
//        --model stories15M --capacity 64 [--seconds 10] [--max-tokens 32] [--json]
//        [--bound-bytes N]
// (`tandem bench overload ...` runs this script.)
import net from 'node:net';

function parseArgs(argv) {
  const o = { baseUrl: '', metricsUrl: '', model: '', capacity: 0, seconds: 10, maxTokens: 32,
              json: false, boundBytes: 0 };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const v = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--base-url') o.baseUrl = v().replace(/\/+$/, '');
    else if (a === '--metrics-url') o.metricsUrl = v().replace(/\/+$/, '');
    else if (a === '--model') o.model = v();
    else if (a === '--capacity') o.capacity = Number(v());
    else if (a === '--seconds') o.seconds = Number(v());
    else if (a === '--max-tokens') o.maxTokens = Number(v());
    else if (a === '--bound-bytes') o.boundBytes = Number(v());
    else if (a === '--json') o.json = true;
    else throw new Error(`unknown argument '${a}'`);
  }
  if (!o.baseUrl || !o.metricsUrl || !o.model) {
    throw new Error('--base-url, --metrics-url and --model are required');
  }
  if (!(o.capacity >= 1 && o.capacity <= 4096)) {
    throw new Error('--capacity N (requests the cluster runs at once) must be in [1, 4096]');
  }
  if (!(o.seconds >= 1 && o.seconds <= 600)) throw new Error('--seconds must be in [1, 600]');
  if (!(o.maxTokens >= 1 && o.maxTokens <= 4096)) throw new Error('--max-tokens in [1, 4096]');
  return o;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function rssBytes(o) {
  try {
    const r = await fetch(`${o.metricsUrl}/metrics`, { signal: AbortSignal.timeout(2000) });
    const text = await r.text();
    const m = text.match(/^process_resident_memory_bytes(?:\{[^}]*\})? ([0-9.e+]+)$/m);
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}

// Samples RSS every 100 ms until stop(); keeps the peak.
function rssSampler(o) {
  let peak = 0, last = 0, running = true;
  const loop = (async () => {
    while (running) {
      const v = await rssBytes(o);
      if (v !== null) {
        last = v;
        peak = Math.max(peak, v);
      }
      await sleep(100);
    }
  })();
  return { async stop() { running = false; await loop; return { peak, last }; } };
}

function body(o, i, stream) {
  return JSON.stringify({ model: o.model, prompt: `Once upon a time, number ${i},`,
                          max_tokens: o.maxTokens, temperature: 0, stream });
}

// One request over a raw socket. mode: 'read' (read everything), 'slow' (read 256 bytes every
// 200 ms), 'never' (never read; hold the socket until the phase ends). Resolves with what the
// client saw: the status, whether an error event came inside a 200 stream, Retry-After.
function request(o, i, { stream, mode, until }) {
  const url = new URL(o.baseUrl);
  return new Promise((resolve) => {
    const out = { status: 0, retryAfter: false, inStreamError: false, done: false, error: '' };
    const s = net.connect({ host: url.hostname, port: Number(url.port || 80) });
    let buf = '';
    let finished = false;
    const finish = (why) => {
      if (finished) return;
      finished = true;
      if (why) out.error = why;
      clearInterval(slow);
      clearTimeout(hardStop);
      s.destroy();
      resolve(out);
    };
    const payload = body(o, i, stream);
    s.on('connect', () => {
      s.write(`POST /v1/completions HTTP/1.1\r\nHost: ${url.host}\r\n` +
              `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(payload)}` +
              `\r\nConnection: close\r\n\r\n${payload}`);
      if (mode !== 'read') s.pause();
    });
    s.on('data', (d) => {
      buf += d.toString('latin1');
      if (!out.status) {
        const m = buf.match(/^HTTP\/1\.[01] (\d{3})/);
        if (m) out.status = Number(m[1]);
      }
      const head = buf.indexOf('\r\n\r\n');
      if (head >= 0 && /\r\nretry-after:/i.test(buf.slice(0, head))) out.retryAfter = true;
      if (out.status === 200 && /data: \{"error"/.test(buf)) out.inStreamError = true;
      // The answer's end, whether or not the server closes the connection after it.
      if (head >= 0) {
        const cl = buf.slice(0, head).match(/\r\ncontent-length: *(\d+)/i);
        if (cl && buf.length - head - 4 >= Number(cl[1])) { out.done = true; return finish(''); }
        if (!cl && buf.endsWith('\r\n0\r\n\r\n')) { out.done = true; return finish(''); }
      }
      if (buf.length > 1 << 20) buf = buf.slice(0, 4096) + buf.slice(-4096);  // bounded
    });
    s.on('end', () => { out.done = true; finish(''); });
    s.on('error', (e) => finish(e.code || String(e)));
    // Slow readers take 256 bytes every 200 ms; never-readers read nothing until the phase ends.
    const slow = mode === 'slow' ? setInterval(() => { s.resume(); setTimeout(() => s.pause(), 1); }, 200)
                                 : null;
    const hardStop = setTimeout(() => finish('held to the end of the phase'),
                                Math.max(0, until - Date.now()) + (mode === 'read' ? 60000 : 0));
  });
}

function tally(results) {
  const t = { requests: results.length, ok: 0, s429: 0, s503: 0, other: 0, withRetryAfter: 0,
              overloadWithoutRetryAfter: 0, inStreamErrors: 0, transport: 0, held: 0 };
  for (const r of results) {
    if (r.status === 200) ++t.ok;
    else if (r.status === 429) ++t.s429;
    else if (r.status === 503) ++t.s503;
    else if (r.status === 0) {
      if (r.error === 'held to the end of the phase') ++t.held;
      else ++t.transport;
    } else ++t.other;
    if ((r.status === 429 || r.status === 503)) {
      if (r.retryAfter) ++t.withRetryAfter; else ++t.overloadWithoutRetryAfter;
    }
    if (r.inStreamError) ++t.inStreamErrors;
  }
  return t;
}

// Closed loop: `clients` loops, each sending the next request when the last ended.
async function closedLoop(o, clients, { stream, mode }) {
  const until = Date.now() + o.seconds * 1000;
  const results = [];
  let i = 0;
  await Promise.all(Array.from({ length: clients }, async () => {
    while (Date.now() < until && results.length < 200000) {
      const r = await request(o, i++, { stream, mode, until });
      results.push(r);
      if (r.status === 0 && mode === 'read') await sleep(50);
      if (mode !== 'read') break;  // slow and never-readers hold one request each
    }
  }));
  return results;
}

// Open loop: `rate` requests per second regardless of answers, for the phase.
async function openLoop(o, rate, { stream }) {
  const until = Date.now() + o.seconds * 1000;
  const pending = [];
  const start = Date.now();
  for (let i = 0; Date.now() < until && pending.length < 200000; ++i) {
    pending.push(request(o, i, { stream, mode: 'read', until }));
    const next = start + ((i + 1) * 1000) / rate;
    if (next > Date.now()) await sleep(next - Date.now());
  }
  return Promise.all(pending);
}

async function phase(o, name, run) {
  const sampler = rssSampler(o);
  const t0 = Date.now();
  const results = await run();
  const seconds = (Date.now() - t0) / 1000;
  const { peak } = await sampler.stop();
  return { name, seconds, rss_peak: peak, ...tally(results) };
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const idle = await rssBytes(o);
  if (idle === null) throw new Error(`${o.metricsUrl}/metrics has no process_resident_memory_bytes`);
  const c = o.capacity;
  const phases = [];
  phases.push(await phase(o, `closed 1x (${c} streams)`, () => closedLoop(o, c, { stream: true, mode: 'read' })));
  const baselineRate = phases[0].ok / phases[0].seconds;
  phases.push(await phase(o, `closed 10x (${10 * c} streams)`, () => closedLoop(o, 10 * c, { stream: true, mode: 'read' })));
  phases.push(await phase(o, `closed 10x (${10 * c} non-streaming)`, () => closedLoop(o, 10 * c, { stream: false, mode: 'read' })));
  const rate = Math.max(1, Math.round(10 * baselineRate));
  phases.push(await phase(o, `open 10x (${rate}/s streams)`, () => openLoop(o, rate, { stream: true })));
  phases.push(await phase(o, `slow readers 10x (${10 * c})`, () => closedLoop(o, 10 * c, { stream: true, mode: 'slow' })));
  phases.push(await phase(o, `never-readers 10x (${10 * c})`, () => closedLoop(o, 10 * c, { stream: true, mode: 'never' })));
  // Recovery: the node serves again and its memory comes back down.
  await sleep(3000);
  const probe = await request(o, 0, { stream: false, mode: 'read', until: Date.now() + 30000 });
  const after = await rssBytes(o);
  const report = { idle_rss: idle, baseline_rate_per_s: baselineRate, bound_bytes: o.boundBytes || null,
                   phases, recovery: { status: probe.status, rss: after } };
  if (o.json) {
    console.log(JSON.stringify(report, null, 2));
    return;
  }
  const mib = (b) => (b / 1048576).toFixed(0);
  console.log(`idle RSS ${mib(idle)} MiB; baseline ${baselineRate.toFixed(1)} requests/s at ${c} streams` +
              (o.boundBytes ? `; bound ${mib(o.boundBytes)} MiB` : ''));
  console.log('| phase | requests | 200 | 429 | 503 | other | 429/503 without Retry-After | in-stream errors | cut | held unread | RSS peak MiB | x baseline |');
  console.log('| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |');
  for (const p of phases) {
    console.log(`| ${p.name} | ${p.requests} | ${p.ok} | ${p.s429} | ${p.s503} | ${p.other} | ` +
                `${p.overloadWithoutRetryAfter} | ${p.inStreamErrors} | ${p.transport} | ${p.held} | ${mib(p.rss_peak)} | ` +
                `${(p.rss_peak / phases[0].rss_peak).toFixed(2)} |`);
  }
  console.log(`recovery: status ${probe.status}, RSS ${mib(after ?? 0)} MiB (${((after ?? 0) / phases[0].rss_peak).toFixed(2)} x baseline peak)`);
  if (probe.status !== 200) process.exitCode = 1;
}

main().catch((e) => {
  console.error(`overload: ${e.message}`);
  process.exit(2);
});
