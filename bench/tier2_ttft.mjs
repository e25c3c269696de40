// Tier 2 vs recomputing (issue 13): time to the first token of a long prompt computed from
// scratch, and of the same prompt once the pools have evicted it and its blocks come back
// from tier 2 — same cluster, same run. Each round sends two new prompts A and B (both
// computed: the baseline samples; B evicts A), then A and B again (each read back from tier
// 2, evicting the other). The cluster's prefill and decode pools must hold one prompt but
// not two, and its manifest must send every prompt through prefill (disaggregate_tokens_min
// = 1) with kv_offload enabled and a decode prefill_timeout_ms longer than a cold prefill.
// Each request asks for one token, greedy: its latency is the time to the first token, and
// the token must be the same both ways (tier 2 gives what computing gives).
//
//   node bench/tier2_ttft.mjs --base-url http://127.0.0.1:19000 --metrics-url
//        http://127.0.0.1:19220 --model NAME [--words 2000] [--rounds 2] [--json]
// (`tandem bench tier2-ttft ...` runs this script.)

function parseArgs(argv) {
  const o = { baseUrl: '', metricsUrl: '', model: '', words: 2000, rounds: 2, json: false };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const v = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--base-url') o.baseUrl = v().replace(/\/+$/, '');
    else if (a === '--metrics-url') o.metricsUrl = v().replace(/\/+$/, '');
    else if (a === '--model') o.model = v();
    else if (a === '--words') o.words = Number(v());
    else if (a === '--rounds') o.rounds = Number(v());
    else if (a === '--json') o.json = true;
    else throw new Error(`unknown argument '${a}'`);
  }
  if (!o.baseUrl || !o.metricsUrl || !o.model) {
    throw new Error('--base-url, --metrics-url and --model are required');
  }
  if (!(o.words >= 16 && o.words <= 1000000)) throw new Error('--words must be in [16, 1e6]');
  if (!(o.rounds >= 1 && o.rounds <= 100)) throw new Error('--rounds must be in [1, 100]');
  return o;
}

// A prompt of `words` words drawn from a seeded generator: each seed its own blocks.
function prompt(seed, words) {
  const vocab = ['the', 'cat', 'sat', 'on', 'a', 'mat', 'dog', 'ran', 'far', 'away', 'home',
                 'big', 'red', 'sun', 'sky', 'tree'];
  let x = (seed * 2654435761) >>> 0;
  const out = [`Story ${seed}:`];
  for (let i = 0; i < words; ++i) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    out.push(vocab[x >>> 28]);
  }
  return out.join(' ');
}

async function metric(url, series) {
  const r = await fetch(`${url}/metrics`);
  const text = await r.text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(series + '{') || line.startsWith(series + ' ')) {
      sum += Number(line.slice(line.lastIndexOf(' ') + 1));
    }
  }
  return sum;
}

async function first_token(o, text) {
  const t0 = performance.now();
  const r = await fetch(`${o.baseUrl}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: o.model, prompt: text, max_tokens: 1, temperature: 0 }),
  });
  const body = await r.json();
  const seconds = (performance.now() - t0) / 1000;
  if (r.status !== 200) throw new Error(`status ${r.status}: ${JSON.stringify(body)}`);
  return { seconds, token: body.choices[0].text, prompt_tokens: body.usage.prompt_tokens };
}

// Write-behind: waits until tier 2 stopped storing (two equal counts 300 ms apart; <= 60 s).
async function settled(url) {
  let last = -1;
  for (let i = 0; i < 200; ++i) {
    const now = await metric(url, 'tandem:tier2_stored_blocks_total');
    if (now === last) return;
    last = now;
    await new Promise((done) => setTimeout(done, 300));
  }
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const cold = [], tier2 = [], loaded = [];
  let same = 0, tokens = 0;
  for (let round = 0; round < o.rounds; ++round) {
    const a = prompt(2 * round + 1, o.words), b = prompt(2 * round + 2, o.words);
    const ca = await first_token(o, a), cb = await first_token(o, b);
    cold.push(ca.seconds, cb.seconds);
    tokens = ca.prompt_tokens;
    await settled(o.metricsUrl);
    for (const [text, computed] of [[a, ca], [b, cb]]) {
      const before = await metric(o.metricsUrl, 'tandem:prefill_tier2_loaded_blocks_total');
      const t = await first_token(o, text);
      const after = await metric(o.metricsUrl, 'tandem:prefill_tier2_loaded_blocks_total');
      tier2.push(t.seconds);
      loaded.push(after - before);
      if (t.token === computed.token) ++same;
    }
  }
  const result = {
    prompt_tokens: tokens, rounds: o.rounds,
    cold_s: cold, tier2_s: tier2, tier2_loaded_blocks: loaded,
    cold_median_s: median(cold), tier2_median_s: median(tier2),
    speedup: median(cold) / median(tier2), same_first_token: `${same}/${tier2.length}`,
  };
  if (o.json) {
    console.log(JSON.stringify(result));
  } else {
    console.log(`prompt ${tokens} tokens, ${o.rounds} round(s)`);
    console.log(`computed:  TTFT median ${result.cold_median_s.toFixed(3)} s ` +
                `(${cold.map((x) => x.toFixed(3)).join(', ')})`);
    console.log(`from tier 2: TTFT median ${result.tier2_median_s.toFixed(3)} s ` +
                `(${tier2.map((x) => x.toFixed(3)).join(', ')}); blocks read back ` +
                `${loaded.join(', ')}`);
    console.log(`speedup ${result.speedup.toFixed(2)}x; same first token ${result.same_first_token}`);
  }
}

main().catch((e) => {
  console.error(`tier2-ttft: ${e.message}`);
  process.exit(1);
});
