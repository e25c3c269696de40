// The official Anthropic SDK against a Tandem gateway: messages (plain and streaming) and
// count_tokens. Prints PASS/FAIL per check; exits non-zero on any failure. Options: see
// sdk_common.mjs.
//   node tests/js/sdk_anthropic.mjs --base-url http://127.0.0.1:PORT --model stories15M
import Anthropic from '@anthropic-ai/sdk';
import { check, expect, expectEqual, expectAuthError, finish, options } from './sdk_common.mjs';

const opts = options();
const client = new Anthropic({
  baseURL: opts.baseUrl, apiKey: opts.apiKey, maxRetries: 0, timeout: 60_000,
});
const MAX_TOKENS = 24;
const request = {
  model: opts.model, max_tokens: MAX_TOKENS, temperature: 0,
  system: 'You tell short stories.',
  messages: [{ role: 'user', content: 'Tell me a story about a bird.' }],
};

async function messagesPlain() {
  const m = await client.messages.create(request);
  expectEqual(m.type, 'message', 'type');
  expectEqual(m.role, 'assistant', 'role');
  expect(m.content.length >= 1 && m.content[0].type === 'text',
         `content ${JSON.stringify(m.content)}`);
  expect(m.content[0].text.length > 0, 'empty text');
  expect(['end_turn', 'max_tokens'].includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
  expect(m.usage.input_tokens > 0, 'usage.input_tokens');
  expect(m.usage.output_tokens > 0 && m.usage.output_tokens <= MAX_TOKENS,
         `usage.output_tokens ${m.usage.output_tokens}`);
  return m;
}

async function messagesStreaming(plain) {
  const stream = await client.messages.create({ ...request, stream: true });
  const types = [];
  let text = '', stopReason = null, outputTokens = null, started = null;
  for await (const event of stream) {
    if (event.type === 'ping') continue;
    if (types[types.length - 1] !== event.type) types.push(event.type);
    if (event.type === 'message_start') started = event.message;
    if (event.type === 'content_block_delta') {
      expectEqual(event.delta.type, 'text_delta', 'delta type');
      text += event.delta.text;
    }
    if (event.type === 'message_delta') {
      stopReason = event.delta.stop_reason;
      outputTokens = event.usage.output_tokens;
    }
  }
  const order = ['message_start', 'content_block_start', 'content_block_delta',
                 'content_block_stop', 'message_delta', 'message_stop'];
  expectEqual(types.join(' > '), order.join(' > '), 'event order');
  expectEqual(started.content.length, 0, 'message_start content');
  expectEqual(started.usage.input_tokens, plain.usage.input_tokens, 'message_start input_tokens');
  expectEqual(stopReason, plain.stop_reason, 'stop_reason');
  expectEqual(outputTokens, plain.usage.output_tokens, 'message_delta output_tokens');
  expectEqual(text, plain.content[0].text, 'streamed text vs non-streaming text');
}

async function main() {
  if (opts.expectAuthError) {
    await check('wrong key: messages.create raises AuthenticationError', () =>
      expectAuthError(() => client.messages.create(request), Anthropic.AuthenticationError));
    await check('wrong key: messages.countTokens raises AuthenticationError', () =>
      expectAuthError(() => client.messages.countTokens(
        { model: opts.model, messages: request.messages }), Anthropic.AuthenticationError));
    return finish('sdk_anthropic');
  }
  let plain = null;
  await check('messages non-streaming', async () => { plain = await messagesPlain(); });
  await check('messages streaming: message_start..message_stop, text equals non-streaming',
              async () => {
                expect(plain, 'needs the non-streaming result');
                await messagesStreaming(plain);
              });
  await check('messages.countTokens matches the input usage', async () => {
    const counted = await client.messages.countTokens(
      { model: opts.model, system: request.system, messages: request.messages });
    expect(counted.input_tokens > 0, `input_tokens ${counted.input_tokens}`);
    if (plain) expectEqual(counted.input_tokens, plain.usage.input_tokens, 'input_tokens');
    const longer = await client.messages.countTokens({
      model: opts.model, system: request.system,
      messages: [{ role: 'user', content: 'Tell me a long story about a bird and a fish.' }],
    });
    expect(longer.input_tokens > counted.input_tokens,
           `a longer prompt counts ${longer.input_tokens} <= ${counted.input_tokens}`);
  });
  finish('sdk_anthropic');
}

await main();
