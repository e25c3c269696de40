#!/usr/bin/env bash
# npm packages the tests use (tests/js/): the reference JS tokenizers pinned in
# package.json / package-lock.json. Idempotent: runs `npm ci` only when node_modules is
# missing or older than package-lock.json. Installs no scripts.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  echo "setup: npm ci (reference tokenizers for tests)"
  npm ci --ignore-scripts --no-audit --no-fund
  touch node_modules
else
  echo "setup: npm packages present"
fi
