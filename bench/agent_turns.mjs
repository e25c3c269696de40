// Prefix reuse across an agent's turns (issue 11): replays a recorded-shape 20-turn session
// (bench/agent_session.mjs: the same system prompt and tools every turn, a growing history
// with tool outputs) through the Messages and Responses APIs and reports, per turn, the cached
// share of the tokens the previous turn's prompt already had, from each answer's `usage`.
// The baseline in the same run is the block-aligned ceiling: a prefix cache of whole blocks
// can reuse at most floor(previous prompt / block) blocks, so the table prints the share and
// its ratio to that ceiling. Goal: share >= 0.95 from turn 2 on.
//
//   node bench/agent_turns.mjs --base-url http://127.0.0.1:8000 --model MiniMax-M2.7 \
//        --block-tokens 256 [--turns 20] [--seed 1] [--api messages,responses] [--json]
// (`tandem bench agent-turns ...` runs this script.)
//
// Exit status: 0 the goal is met; 3 the figures were printed but the goal is NOT met; 1 an
// error (bad arguments, a failed request: no summary). Callers tell "the prefix cache reused
// too little" (3) from "could not measure" (1).
import { messagesBody, postStream, responsesBody, chatBody, session } from './agent_session.mjs';

function parseArgs(argv) {
  const o = { baseUrl: '', model: '', blockTokens: 0, turns: 20, seed: 1,
              apis: ['messages', 'responses'], json: false };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const v = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--base-url') o.baseUrl = v().replace(/\/+$/, '');
    else if (a === '--model') o.model = v();
    else if (a === '--block-tokens') o.blockTokens = Number(v());
    else if (a === '--turns') o.turns = Number(v());
    else if (a === '--seed') o.seed = Number(v());
    else if (a === '--api') o.apis = v().split(',');
    else if (a === '--json') o.json = true;
    else throw new Error(`unknown argument '${a}'`);
  }
  if (!o.baseUrl || !o.model) throw new Error('--base-url and --model are required');
  if (!(o.blockTokens >= 1)) throw new Error('--block-tokens N (the manifest\'s block_tokens) is required');
  if (!(o.turns >= 2 && o.turns <= 200)) throw new Error('--turns must be in [2, 200]');
  for (const api of o.apis) {
    if (!['messages', 'responses', 'chat'].includes(api)) throw new Error(`unknown api '${api}'`);
  }
  return o;
}

async function runApi(o, api) {
  // Each API gets its own seed's session: no turn of one can hit the other's cache.
  const s = session({ seed: o.seed + (api === 'messages' ? 0 : api === 'responses' ? 1000 : 2000),
                      turns: o.turns });
  const body = api === 'messages' ? messagesBody : api === 'responses' ? responsesBody : chatBody;
  const rows = [];
  let previous = 0;
  for (let k = 0; k < o.turns; ++k) {
    const r = await postStream(o.baseUrl, api, body(s, k, o.model));
    if (r.status !== 200 || !r.usage) {
      throw new Error(`${api} turn ${k + 1}: status ${r.status}: ${r.text.slice(0, 300)}`);
    }
    const ceiling = previous > 0 ? Math.floor(previous / o.blockTokens) * o.blockTokens : 0;
    rows.push({ api, turn: k + 1, prompt: r.usage.prompt, cached: r.usage.cached, previous,
                share: previous > 0 ? r.usage.cached / previous : null,
                ceiling_share: previous > 0 ? ceiling / previous : null });
    previous = r.usage.prompt;
  }
  return rows;
}

function fmt(x) { return x === null ? '-' : x.toFixed(3); }

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const all = [];
  for (const api of o.apis) all.push(...await runApi(o, api));
  if (o.json) {
    console.log(JSON.stringify(all, null, 1));
  } else {
    console.log('api        turn  prompt  cached  prev_prompt  share  ceiling  share/ceiling');
    for (const r of all) {
      console.log(`${r.api.padEnd(10)} ${String(r.turn).padStart(4)} ${String(r.prompt).padStart(7)} ` +
                  `${String(r.cached).padStart(7)} ${String(r.previous).padStart(12)}  ` +
                  `${fmt(r.share).padStart(5)}  ${fmt(r.ceiling_share).padStart(7)}  ` +
                  `${r.share === null ? '-' : fmt(r.share / r.ceiling_share).padStart(13)}`);
    }
  }
  let worst = 1;
  for (const r of all) if (r.share !== null) worst = Math.min(worst, r.share);
  const met = worst >= 0.95;
  console.log(`summary: ${o.apis.join('+')}, turns 2..${o.turns}: lowest share ${worst.toFixed(3)} ` +
              `(goal >= 0.95: ${met ? 'met' : 'NOT met'})`);
  return met;
}

const goalNotMetExitCode = 3;

main().then((met) => {
  if (!met) process.exitCode = goalNotMetExitCode;  // after the figures: stdout drains first
}).catch((err) => {
  console.error(`error: ${err.message}`);
  process.exit(1);
});
