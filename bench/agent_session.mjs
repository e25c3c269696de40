// A recorded-shape coding-agent session, deterministic from a seed: the same system prompt
// (several blocks) and 24 tools every turn, a growing history of assistant turns with
// reasoning and tool calls, and tool outputs (file contents, command output). Shared by the
// prefix-reuse benchmark (bench/agent_turns.mjs) and the agent request replay test
// (tests/js/agent_replay.mjs), which send it through the Messages, Responses and Chat APIs.

// xorshift32: the same session for the same seed on every machine.
export function rng(seed) {
  let x = (seed >>> 0) || 0x9e3779b9;
  return () => {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    return x / 0x100000000;
  };
}

const words = ['buffer', 'request', 'token', 'block', 'cache', 'decode', 'prefill', 'router',
  'stream', 'event', 'parser', 'config', 'error', 'result', 'value', 'index', 'count', 'bytes',
  'queue', 'timer', 'actor', 'frame', 'layer', 'shape', 'batch', 'score', 'prefix', 'node'];

function pick(r, list) { return list[Math.floor(r() * list.length)]; }

// `lines` lines of C++-looking source.
export function sourceFile(r, name, lines) {
  const out = [`// ${name}`, '#include <vector>', ''];
  for (let i = 0; i < lines; ++i) {
    const a = pick(r, words), b = pick(r, words), c = pick(r, words);
    const n = Math.floor(r() * 1000);
    out.push(i % 7 === 0 ? `int ${a}_${b}(const ${c}& in) {` :
             i % 7 === 6 ? '}' : `  auto ${a}_${n} = in.${b}() + ${c}_${n % 17};`);
  }
  return out.join('\n');
}

export function tools(count = 24) {
  const out = [];
  for (let i = 0; i < count; ++i) {
    out.push({
      name: `tool_${i}_${words[i % words.length]}`,
      description: `Does ${words[(i * 7) % words.length]} work on the repository (tool ${i}).`,
      parameters: {
        type: 'object',
        properties: {
          path: { type: 'string', description: 'A path relative to the repository root' },
          pattern: { type: 'string' },
          limit: { type: 'integer', minimum: 1 },
          options: { type: 'object', properties: { recursive: { type: 'boolean' } } },
        },
        required: ['path'],
      },
    });
  }
  return out;
}

// The session: systemBlocks (strings), tools, the first user task, and per turn the
// assistant's reasoning, text and one or two tool calls with their outputs.
export function session({ seed = 1, turns = 20, systemLines = 900, outputLines = 60 } = {}) {
  const r = rng(seed);
  const systemBlocks = [
    'You are a coding agent working in a C++ repository. Follow the rules below.',
    sourceFile(r, 'AGENTS.md (repository context)', systemLines),
    'Use the tools to read and change files. Answer briefly.',
  ];
  const steps = [];
  for (let t = 0; t < turns; ++t) {
    const calls = [];
    const callsCount = t % 3 === 2 ? 2 : 1;
    for (let c = 0; c < callsCount; ++c) {
      const path = `src/${pick(r, words)}/${pick(r, words)}_${t}_${c}.cpp`;
      calls.push({
        id: `call_${seed}_${t}_${c}`,
        name: `tool_${(t + c) % 24}_${words[((t + c) % 24) % words.length]}`,
        arguments: { path, limit: 200 + t, options: { recursive: c === 0 } },
        output: sourceFile(r, path, outputLines + Math.floor(r() * outputLines)),
      });
    }
    steps.push({
      reasoning: `Turn ${t}: I should look at ${calls.map((c) => c.arguments.path).join(' and ')}.`,
      text: `Reading ${calls.length} file${calls.length > 1 ? 's' : ''}.`,
      calls,
    });
  }
  return { systemBlocks, tools: tools(), task: 'Find why the router drops blocks and fix it.',
           steps };
}

// `extra` holds fields to add to the body, and options of ours (systemInMessages: a system /
// developer entry after the first user message) that are not sent.
function withoutOptions(extra) {
  const { systemInMessages, ...rest } = extra;
  void systemInMessages;
  return rest;
}

// Request bodies for turn `k` (0-based: turn k carries steps 0..k-1 as history).
export function messagesBody(s, k, model, extra = {}) {
  const messages = [{ role: 'user', content: [{ type: 'text', text: s.task,
                                                cache_control: { type: 'ephemeral' } }] }];
  // Claude Code style: a system entry inside messages after the first user turn.
  if (extra.systemInMessages) {
    messages.push({ role: 'system', content: 'Reminder: keep answers short.' });
  }
  for (const step of s.steps.slice(0, k)) {
    messages.push({ role: 'assistant', content: [
      { type: 'thinking', thinking: step.reasoning, signature: 'sig' },
      { type: 'text', text: step.text },
      ...step.calls.map((c) => ({ type: 'tool_use', id: c.id, name: c.name, input: c.arguments })),
    ] });
    messages.push({ role: 'user', content: step.calls.map((c) => ({
      type: 'tool_result', tool_use_id: c.id, content: [{ type: 'text', text: c.output }] })) });
  }
  return {
    model, max_tokens: 8000, stream: true,
    system: s.systemBlocks.map((text, i) => ({ type: 'text', text,
      ...(i === s.systemBlocks.length - 1 ? { cache_control: { type: 'ephemeral' } } : {}) })),
    tools: s.tools.map((t) => ({ name: t.name, description: t.description,
                                 input_schema: t.parameters })),
    thinking: { type: 'enabled', budget_tokens: 4000 },
    metadata: { user_id: 'bench' },
    messages, ...withoutOptions(extra),
  };
}

export function responsesBody(s, k, model, extra = {}) {
  const input = [
    { type: 'message', role: 'developer', content: [{ type: 'input_text', text: s.systemBlocks[1] }] },
    { type: 'message', role: 'developer', content: [{ type: 'input_text', text: s.systemBlocks[2] }] },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: s.task }] },
  ];
  if (extra.systemInMessages) {
    input.push({ type: 'message', role: 'system', content: 'Reminder: keep answers short.' });
  }
  for (const step of s.steps.slice(0, k)) {
    input.push({ type: 'reasoning', id: `rs_${k}`, encrypted_content: 'opaque',
                 summary: [{ type: 'summary_text', text: step.reasoning }] });
    input.push({ type: 'message', role: 'assistant',
                 content: [{ type: 'output_text', text: step.text, annotations: [] }] });
    for (const c of step.calls) {
      input.push({ type: 'function_call', call_id: c.id, name: c.name,
                   arguments: JSON.stringify(c.arguments) });
    }
    for (const c of step.calls) {
      input.push({ type: 'function_call_output', call_id: c.id, output: c.output });
    }
  }
  return {
    model, instructions: s.systemBlocks[0], input, stream: true, store: false,
    include: ['reasoning.encrypted_content'], reasoning: { effort: 'medium', summary: 'auto' },
    tools: s.tools.map((t) => ({ type: 'function', name: t.name, description: t.description,
                                 parameters: t.parameters })),
    tool_choice: 'auto', parallel_tool_calls: true, prompt_cache_key: 'bench',
    ...withoutOptions(extra),
  };
}

export function chatBody(s, k, model, extra = {}) {
  const messages = [{ role: 'system', content: s.systemBlocks.join('\n\n') },
                    { role: 'user', content: s.task }];
  if (extra.systemInMessages) {
    messages.push({ role: 'developer', content: 'Reminder: keep answers short.' });
  }
  for (const step of s.steps.slice(0, k)) {
    messages.push({ role: 'assistant', content: step.text, reasoning_content: step.reasoning,
      tool_calls: step.calls.map((c) => ({ id: c.id, type: 'function',
        function: { name: c.name, arguments: JSON.stringify(c.arguments) } })) });
    for (const c of step.calls) messages.push({ role: 'tool', tool_call_id: c.id, content: c.output });
  }
  return {
    model, messages, stream: true, stream_options: { include_usage: true }, max_tokens: 8000,
    tools: s.tools.map((t) => ({ type: 'function', function: t })), tool_choice: 'auto',
    parallel_tool_calls: true, reasoning_effort: 'medium', ...withoutOptions(extra),
  };
}

// Posts one streamed request and returns { status, usage, events, text } (usage normalized to
// { prompt, cached, completion }); the stream must end with the API's terminator.
export async function postStream(baseUrl, api, body, headers = {}) {
  const path = api === 'messages' ? '/v1/messages' : api === 'responses' ? '/v1/responses'
                                                   : '/v1/chat/completions';
  const res = await fetch(baseUrl + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': 'sk-none',
               'anthropic-version': '2023-06-01', ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  if (res.status !== 200) return { status: res.status, text, events: [], usage: null };
  const events = [];
  for (const block of text.split('\n\n')) {
    const data = block.split('\n').find((l) => l.startsWith('data: '));
    if (!data) continue;
    const payload = data.slice(6);
    events.push(payload === '[DONE]' ? '[DONE]' : JSON.parse(payload));
  }
  let usage = null;
  for (const e of events) {
    if (api === 'messages' && e.type === 'message_start') {
      const u = e.message.usage;
      usage = { prompt: u.input_tokens + u.cache_read_input_tokens, cached: u.cache_read_input_tokens };
    }
    if (api === 'messages' && e.type === 'message_delta') {
      // The final usage: Tandem learns the cached count from decode after message_start (whose
      // cache_read_input_tokens is therefore 0); message_delta carries the real split.
      const u = e.usage;
      if (u.cache_read_input_tokens !== undefined && u.input_tokens !== undefined) {
        usage = { prompt: u.input_tokens + u.cache_read_input_tokens,
                  cached: u.cache_read_input_tokens };
      }
      usage.completion = u.output_tokens;
    }
    if (api === 'responses' && e.type === 'response.completed') {
      const u = e.response.usage;
      usage = { prompt: u.input_tokens, cached: u.input_tokens_details.cached_tokens,
                completion: u.output_tokens };
    }
    if (api === 'chat' && e !== '[DONE]' && e.usage) {
      usage = { prompt: e.usage.prompt_tokens,
                cached: e.usage.prompt_tokens_details?.cached_tokens ?? 0,
                completion: e.usage.completion_tokens };
    }
  }
  return { status: res.status, text, events, usage };
}
