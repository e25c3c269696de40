// Issue 11: request bodies in the shape coding agents send (bench/agent_session.mjs: a
// system prompt in several blocks with cache_control, 24 tools with JSON Schema, system /
// developer entries inside messages, reasoning items and thinking blocks sent back, tool
// calls and outputs, stream with usage, prompts past 30K tokens) replayed through each API.
// Each must answer 200 with a complete, well-formed stream; never a 400.
//   node tests/js/agent_replay.mjs --base-url URL --model NAME
import { check, expect, expectEqual, finish, options } from './sdk_common.mjs';
import { chatBody, messagesBody, postStream, responsesBody, session } from
  '../../bench/agent_session.mjs';

const opts = options();
const s = session({ seed: 7, turns: 20 });
const extra = { systemInMessages: true };

function checkChat(events) {
  expectEqual(events.at(-1), '[DONE]', 'last event');
  const chunks = events.slice(0, -1);
  expectEqual(chunks[0].choices[0].delta.role, 'assistant', 'first delta role');
  const finishes = chunks.filter((c) => c.choices.length && c.choices[0].finish_reason);
  expectEqual(finishes.length, 1, 'chunks with finish_reason');
  const usage = chunks.at(-1);
  expect(usage.choices.length === 0 && usage.usage?.prompt_tokens > 0, 'usage chunk last');
  let content = '', reasoning = '';
  for (const c of chunks) {
    if (!c.choices.length) continue;
    content += c.choices[0].delta.content ?? '';
    reasoning += c.choices[0].delta.reasoning_content ?? '';
  }
  expect(content.length > 0, 'some content');
  expect(reasoning.length > 0, 'some reasoning');
  return usage.usage.prompt_tokens;
}

function checkResponses(events) {
  expectEqual(events[0].type, 'response.created', 'first event');
  events.forEach((e, i) => expectEqual(e.sequence_number, i, `sequence_number of event ${i}`));
  const done = events.at(-1);
  expectEqual(done.type, 'response.completed', 'last event');
  expectEqual(done.response.status, 'completed', 'status');
  const types = done.response.output.map((o) => o.type);
  expect(types.includes('message'), `a message item in ${types}`);
  expect(types.includes('reasoning'), `a reasoning item in ${types}`);
  const added = events.filter((e) => e.type === 'response.output_item.added').length;
  const itemsDone = events.filter((e) => e.type === 'response.output_item.done').length;
  expectEqual(itemsDone, added, 'every output item added is done');
  return done.response.usage.input_tokens;
}

function checkMessages(events) {
  expectEqual(events[0].type, 'message_start', 'first event');
  expectEqual(events.at(-1).type, 'message_stop', 'last event');
  const open = new Set();
  const kinds = [];
  for (const e of events) {
    if (e.type === 'content_block_start') { open.add(e.index); kinds.push(e.content_block.type); }
    if (e.type === 'content_block_stop') {
      expect(open.has(e.index), `stop of an unopened block ${e.index}`);
      open.delete(e.index);
    }
  }
  expectEqual(open.size, 0, 'blocks left open');
  expect(kinds.includes('thinking') && kinds.includes('text'), `thinking and text in ${kinds}`);
  const delta = events.find((e) => e.type === 'message_delta');
  expect(['end_turn', 'max_tokens'].includes(delta?.delta?.stop_reason), 'stop_reason');
  const u = events[0].message.usage;
  return u.input_tokens + u.cache_read_input_tokens;
}

const apis = [
  ['messages', messagesBody, checkMessages],
  ['responses', responsesBody, checkResponses],
  ['chat', chatBody, checkChat],
];
for (const [api, body, checkStream] of apis) {
  for (const turn of [1, 8, 20]) {
    await check(`${api} turn ${turn}`, async () => {
      const r = await postStream(opts.baseUrl, api, body(s, turn - 1, opts.model, extra),
                                 { authorization: `Bearer ${opts.apiKey}` });
      expectEqual(r.status, 200, `status (body: ${r.text.slice(0, 300)})`);
      const prompt = checkStream(r.events);
      if (turn === 20) expect(prompt > 30000, `a 30K+ token prompt (got ${prompt})`);
    });
  }
}
finish('agent_replay.mjs');
