// Issue 11: the official OpenAI and Anthropic SDKs as coding agents use them, against a
// Tandem serving config/examples/agents.toml (MiniMax-M2 format, sim device): Chat with tools
// streaming, Responses with function calls and their outputs sent back, Messages with a
// tool_use / tool_result round trip, count_tokens. The sim never calls tools itself, so the
// calls are the client's history: what is checked is that every shape is accepted and
// answered completely (reasoning and text), with usage, under a served alias too.
//   node tests/js/sdk_agents.mjs --base-url URL --model NAME
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { check, expect, expectEqual, finish, options } from './sdk_common.mjs';

const opts = options();
const openai = new OpenAI({ baseURL: `${opts.baseUrl}/v1`, apiKey: opts.apiKey, maxRetries: 0,
                            timeout: 60_000 });
const anthropic = new Anthropic({ baseURL: opts.baseUrl, apiKey: opts.apiKey, maxRetries: 0,
                                  timeout: 60_000 });
const params = { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] };
const chatTools = [
  { type: 'function', function: { name: 'read_file', description: 'Read a file', parameters: params } },
  { type: 'function', function: { name: 'list_dir', description: 'List a dir', parameters: params } },
];

await check('chat: tools, a tool round trip in history, streaming with usage', async () => {
  const stream = await openai.chat.completions.create({
    model: opts.model, stream: true, stream_options: { include_usage: true }, max_tokens: 4096,
    tools: chatTools, tool_choice: 'auto', parallel_tool_calls: true,
    messages: [
      { role: 'system', content: 'You code.' },
      { role: 'user', content: 'Read main.c' },
      { role: 'assistant', content: null, tool_calls: [
        { id: 'call_1', type: 'function', function: { name: 'read_file', arguments: '{"path":"main.c"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'int main() { return 0; }' },
      { role: 'developer', content: 'Be brief.' },
    ],
  });
  let content = '', reasoning = '', finishReason = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    content += choice.delta.content ?? '';
    reasoning += choice.delta.reasoning_content ?? '';
    if (choice.finish_reason) finishReason = choice.finish_reason;
  }
  expect(content.length > 0 && reasoning.length > 0, 'content and reasoning_content');
  expect(['stop', 'length'].includes(finishReason), `finish_reason ${finishReason}`);
  expect(usage?.prompt_tokens > 0, 'usage.prompt_tokens');
  expect(usage.completion_tokens_details.reasoning_tokens > 0, 'reasoning_tokens counted');
  expect(usage.completion_tokens_details.reasoning_tokens < usage.completion_tokens,
         'reasoning_tokens < completion_tokens');
});

await check('responses: function_call and function_call_output items, streamed', async () => {
  const stream = await openai.responses.create({
    model: opts.model, stream: true, store: false, max_output_tokens: 4096,
    instructions: 'You code.', include: ['reasoning.encrypted_content'],
    reasoning: { effort: 'medium', summary: 'auto' },
    tools: chatTools.map((t) => ({ type: 'function', ...t.function })),
    input: [
      { type: 'message', role: 'developer', content: 'Use the tools.' },
      { type: 'message', role: 'user', content: 'What is in src?' },
      { type: 'reasoning', id: 'rs_1', summary: [{ type: 'summary_text', text: 'List it.' }],
        encrypted_content: 'opaque' },
      { type: 'function_call', call_id: 'c1', name: 'list_dir', arguments: '{"path":"src"}' },
      { type: 'function_call_output', call_id: 'c1', output: 'a.c\nb.c' },
    ],
  });
  let completed = null;
  for await (const event of stream) if (event.type === 'response.completed') completed = event.response;
  expectEqual(completed?.status, 'completed', 'status');
  expect(completed.output.some((o) => o.type === 'message'), 'a message item');
  const text = completed.output.filter((o) => o.type === 'message')
    .flatMap((o) => o.content).map((c) => c.text ?? '').join('');
  expect(text.length > 0, 'output text');
  expect(completed.usage.output_tokens_details.reasoning_tokens > 0, 'reasoning_tokens');
});

await check('messages: tool_use / tool_result round trip, thinking, streaming', async () => {
  const stream = await anthropic.messages.create({
    model: opts.model, max_tokens: 4096, stream: true,
    thinking: { type: 'enabled', budget_tokens: 1024 },
    system: [{ type: 'text', text: 'You code.', cache_control: { type: 'ephemeral' } }],
    tools: [{ name: 'read_file', description: 'Read a file', input_schema: params }],
    messages: [
      { role: 'user', content: 'Read main.c' },
      { role: 'assistant', content: [
        { type: 'thinking', thinking: 'I will read it.', signature: 'sig' },
        { type: 'tool_use', id: 'toolu_1', name: 'read_file', input: { path: 'main.c' } }] },
      { role: 'user', content: [
        { type: 'tool_result', tool_use_id: 'toolu_1', content: 'int main() {}' },
        { type: 'text', text: 'Now explain it.' }] },
    ],
  });
  const blocks = [];
  let stop = null;
  for await (const event of stream) {
    if (event.type === 'content_block_start') blocks.push(event.content_block.type);
    if (event.type === 'message_delta') stop = event.delta.stop_reason;
  }
  expect(blocks.includes('thinking') && blocks.includes('text'), `blocks ${blocks}`);
  expect(['end_turn', 'max_tokens'].includes(stop), `stop_reason ${stop}`);
});

await check('messages: count_tokens with tools and a system entry in messages', async () => {
  const r = await anthropic.messages.countTokens({
    model: opts.model, system: 'You code.',
    tools: [{ name: 'read_file', description: 'Read a file', input_schema: params }],
    messages: [{ role: 'user', content: 'hi' }, { role: 'system', content: 'Be brief.' }],
  });
  expect(r.input_tokens > 10, `input_tokens ${r.input_tokens}`);
});

await check('models: the served names are listed', async () => {
  const ids = [];
  for await (const m of openai.models.list()) ids.push(m.id);
  expect(ids.includes(opts.model), `${opts.model} in ${ids}`);
});

finish('sdk_agents.mjs');
