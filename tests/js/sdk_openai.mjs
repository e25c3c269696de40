// The official OpenAI SDK against a Tandem gateway: models, chat (plain and streaming with
// usage), completions, chat logprobs, and the Responses API streaming. Prints PASS/FAIL per
// check; exits non-zero on any failure. Options: see sdk_common.mjs.
//   node tests/js/sdk_openai.mjs --base-url http://127.0.0.1:PORT --model stories15M
import OpenAI from 'openai';
import { check, expect, expectEqual, expectAuthError, finish, options } from './sdk_common.mjs';

const opts = options();
const client = new OpenAI({
  baseURL: `${opts.baseUrl}/v1`, apiKey: opts.apiKey, maxRetries: 0, timeout: 60_000,
});
const MAX_TOKENS = 24;
const messages = [{ role: 'user', content: 'Tell me a story about a cat.' }];

async function authFailures() {
  await check('wrong key: models.list raises AuthenticationError', () =>
    expectAuthError(() => client.models.list(), OpenAI.AuthenticationError));
  await check('wrong key: chat.completions.create raises AuthenticationError', () =>
    expectAuthError(() => client.chat.completions.create(
      { model: opts.model, messages, max_tokens: 4 }), OpenAI.AuthenticationError));
  await check('wrong key: responses.create raises AuthenticationError', () =>
    expectAuthError(() => client.responses.create(
      { model: opts.model, input: 'hi', max_output_tokens: 4 }), OpenAI.AuthenticationError));
}

async function chatPlain() {
  const r = await client.chat.completions.create(
    { model: opts.model, messages, max_tokens: MAX_TOKENS, temperature: 0 });
  expectEqual(r.object, 'chat.completion', 'object');
  expectEqual(r.choices.length, 1, 'choices');
  const choice = r.choices[0];
  expectEqual(choice.message.role, 'assistant', 'role');
  expect(typeof choice.message.content === 'string' && choice.message.content.length > 0,
         `empty content: ${JSON.stringify(choice.message)}`);
  expect(['stop', 'length'].includes(choice.finish_reason),
         `finish_reason ${choice.finish_reason}`);
  expect(r.usage.prompt_tokens > 0, 'usage.prompt_tokens');
  expect(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= MAX_TOKENS,
         `usage.completion_tokens ${r.usage.completion_tokens}`);
  expectEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens,
              'usage.total_tokens');
  return r;
}

async function chatStreaming(plain) {
  const stream = await client.chat.completions.create({
    model: opts.model, messages, max_tokens: MAX_TOKENS, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', role = null, finish = null, usage = null, chunks = 0, afterUsage = 0;
  for await (const chunk of stream) {
    chunks += 1;
    expectEqual(chunk.object, 'chat.completion.chunk', 'chunk.object');
    if (usage) afterUsage += 1;
    if (chunk.usage) {
      expectEqual(chunk.choices.length, 0, 'choices in the usage chunk');
      usage = chunk.usage;
      continue;
    }
    const delta = chunk.choices[0].delta;
    if (chunks === 1) role = delta.role;
    if (delta.content) text += delta.content;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  expectEqual(role, 'assistant', 'role of the first delta');
  expectEqual(finish, plain.choices[0].finish_reason, 'finish_reason');
  expect(usage !== null, 'no usage chunk arrived');
  expectEqual(afterUsage, 0, 'chunks after the usage chunk');
  expectEqual(usage.prompt_tokens, plain.usage.prompt_tokens, 'usage.prompt_tokens');
  expectEqual(usage.completion_tokens, plain.usage.completion_tokens, 'usage.completion_tokens');
  expectEqual(text, plain.choices[0].message.content, 'streamed text vs non-streaming text');
}

async function completions() {
  const r = await client.completions.create(
    { model: opts.model, prompt: 'Once upon a time', max_tokens: MAX_TOKENS, temperature: 0 });
  expectEqual(r.object, 'text_completion', 'object');
  expect(typeof r.choices[0].text === 'string' && r.choices[0].text.length > 0, 'empty text');
  expect(r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 0, 'usage');
  const again = await client.completions.create(
    { model: opts.model, prompt: 'Once upon a time', max_tokens: MAX_TOKENS, temperature: 0 });
  expectEqual(again.choices[0].text, r.choices[0].text, 'temperature 0 text on a second call');
}

// logprobs / top_logprobs read through the SDK's types: one entry per generated token, the
// greedy token is the most probable alternative, alternatives descend, all logprobs <= 0.
async function chatLogprobs() {
  const TOP = 3;
  const r = await client.chat.completions.create({
    model: opts.model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: TOP,
  });
  const content = r.choices[0].logprobs?.content;
  expect(Array.isArray(content), `no logprobs.content: ${JSON.stringify(r.choices[0])}`);
  expectEqual(content.length, r.usage.completion_tokens, 'one logprob per generated token');
  expectEqual(r.choices[0].logprobs.refusal, null, 'logprobs.refusal');
  let joined = '';
  for (const entry of content) {
    expect(entry.logprob <= 0, `logprob ${entry.logprob} > 0`);
    expectEqual(entry.top_logprobs.length, TOP, 'top_logprobs length');
    expectEqual(entry.top_logprobs[0].token, entry.token, 'greedy token is the top one');
    expectEqual(entry.top_logprobs[0].logprob, entry.logprob, 'greedy logprob is the top one');
    for (let i = 1; i < TOP; ++i) {
      expect(entry.top_logprobs[i].logprob <= entry.top_logprobs[i - 1].logprob,
             'top_logprobs descend');
    }
    expectEqual(JSON.stringify(entry.bytes), JSON.stringify([...Buffer.from(entry.token)]),
                'bytes are the token\'s UTF-8');
    joined += entry.token;
  }
  expectEqual(joined, r.choices[0].message.content, 'tokens join to the content');
}

// The terminal event is response.completed when the model stopped by itself, and
// response.incomplete (reason max_output_tokens) when it used the whole max_output_tokens.
const RESPONSE_ORDER = [
  'response.created', 'response.in_progress', 'response.output_item.added',
  'response.content_part.added', 'response.output_text.delta', 'response.output_text.done',
  'response.content_part.done', 'response.output_item.done',
];

async function responsesStreaming() {
  const stream = await client.responses.create({
    model: opts.model, input: 'Tell me a story about a dog.', max_output_tokens: MAX_TOKENS,
    temperature: 0, stream: true,
  });
  const types = [];
  let lastSeq = -1, deltas = '', doneText = null, final = null;
  for await (const event of stream) {
    expect(event.sequence_number > lastSeq, `sequence_number ${event.sequence_number} after ` +
           `${lastSeq} (${event.type})`);
    lastSeq = event.sequence_number;
    if (types[types.length - 1] !== event.type) types.push(event.type);
    if (event.type === 'response.output_text.delta') deltas += event.delta;
    if (event.type === 'response.output_text.done') doneText = event.text;
    if (event.type === 'response.completed' || event.type === 'response.incomplete') {
      final = event.response;
    }
  }
  expect(final, `no response.completed / response.incomplete event: ${types.join(' > ')}`);
  expect(final.usage && final.usage.input_tokens > 0, 'usage.input_tokens');
  const outputTokens = final.usage.output_tokens;
  expect(outputTokens > 0 && outputTokens <= MAX_TOKENS, `usage.output_tokens ${outputTokens}`);
  const capped = outputTokens === MAX_TOKENS;
  const terminal = capped ? 'response.incomplete' : 'response.completed';
  expectEqual(types.join(' > '), [...RESPONSE_ORDER, terminal].join(' > '), 'event order');
  expectEqual(final.status, capped ? 'incomplete' : 'completed', 'response.status');
  if (capped) expectEqual(final.incomplete_details?.reason, 'max_output_tokens', 'reason');
  expectEqual(doneText, deltas, 'output_text.done text vs the deltas');
  expectEqual(final.usage.total_tokens, final.usage.input_tokens + outputTokens, 'total_tokens');
  expect(final.usage.input_tokens_details?.cached_tokens !== undefined,
         'usage.input_tokens_details.cached_tokens');
  expect(final.usage.output_tokens_details?.reasoning_tokens !== undefined,
         'usage.output_tokens_details.reasoning_tokens');
  const message = final.output.find((item) => item.type === 'message');
  expect(message, 'no message item in the final response.output');
  expectEqual(message.content[0].text, deltas, 'final output text vs the deltas');
}

async function main() {
  if (opts.expectAuthError) {
    await authFailures();
    return finish('sdk_openai');
  }
  await check('models.list lists the served model', async () => {
    const ids = [];
    for await (const model of client.models.list()) ids.push(model.id);
    expect(ids.includes(opts.model), `model list ${JSON.stringify(ids)}`);
  });
  let plain = null;
  await check('chat.completions non-streaming', async () => { plain = await chatPlain(); });
  await check('chat.completions streaming with include_usage equals non-streaming', async () => {
    expect(plain, 'needs the non-streaming result');
    await chatStreaming(plain);
  });
  await check('completions (text prompt, deterministic at temperature 0)', completions);
  await check('chat.completions logprobs + top_logprobs', chatLogprobs);
  await check('responses streaming: events in order, final response with usage',
              responsesStreaming);
  finish('sdk_openai');
}

await main();
