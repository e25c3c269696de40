#!/usr/bin/env bash
# The README's two commands:
#   bash tools/quickstart.sh serve   set up, build, start the local cluster (API on 127.0.0.1:8000)
#   bash tools/quickstart.sh test    set up, build, run the whole test suite
#   bash tools/quickstart.sh agents  set up, build, serve config/examples/agents.toml (sim
#                                    device, MiniMax-M2 chat format) for coding agents
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
mode="${1:-}"
case "$mode" in
  serve|test|agents) ;;
  *) echo "usage: bash tools/quickstart.sh serve|test|agents" >&2; exit 2 ;;
esac

bash tools/setup.sh
if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=debugoptimized
fi
ninja -C build
bash tools/setup.d/40-agents-model.sh   # needs the built tandem (agents.toml's model)

if [ "$mode" = serve ]; then
  exec build/tools/tandem up config/examples/local.toml
fi
if [ "$mode" = agents ]; then
  exec build/tools/tandem up config/examples/agents.toml
fi

set +e
meson test -C build --num-processes 1 --print-errorlogs --no-rebuild
rc=$?
set -e
summary_rc=0
python3 tools/test-summary.py build/meson-logs/testlog.json || summary_rc=$?
if [ $rc -ne 0 ] || [ $summary_rc -ne 0 ]; then exit 1; fi
