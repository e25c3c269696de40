#!/usr/bin/env bash
# The model directory of config/examples/agents.toml (owner: issue 11): a tiny random
# MiniMax-M2-shaped checkpoint from `tandem model synth --arch minimax-m2` in
# models/minimax-m2-synth/. The sim device computes nothing with its weights; the gateway
# uses its tokenizer, whose added tokens are MiniMax-M2's chat markers. The vocabulary
# (512) must match agents.toml's [sim] vocab, bos_id and eos_id.
# Needs the built `tandem` (build/tools/tandem, or $TANDEM_BIN): run before the first build
# (as part of tools/setup.sh) it says so and does nothing; tools/quickstart.sh runs it again
# after the build. Idempotent: does nothing when the directory was made with these options.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${TANDEM_BIN:-$root/build/tools/tandem}"
dir="$root/models/minimax-m2-synth"
args=(--arch minimax-m2 --vocab 512 --max-position 204800 --seed 0)
stamp="$dir/.synth-options"

if [ -f "$dir/tokenizer.json" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${args[*]}" ]; then
  echo "setup: model minimax-m2-synth present"
  exit 0
fi
if [ ! -x "$bin" ]; then
  echo "setup: model minimax-m2-synth: waits for the build ($bin); quickstart runs this again"
  exit 0
fi
"$bin" model synth "${args[@]}" --out "$dir"
echo "${args[*]}" >"$stamp"
echo "setup: model minimax-m2-synth written to models/minimax-m2-synth/"
