#!/usr/bin/env bash
# The README's two commands:
#   bash tools/quickstart.sh serve   set up, build, start the local cluster (API on 127.0.0.1:8000)
#   bash tools/quickstart.sh test    set up, build, run the whole test suite with g++ (build/),
#                                    then again under ASan + UBSan + LSan (build-asan/; skip
#                                    with TANDEM_SANITIZE=0), then each fuzz target for
#                                    FUZZ_SECONDS (default 30) with clang (build-fuzz/,
#                                    tools/fuzz-run.sh) when clang is installed
#   bash tools/quickstart.sh sanitize  the same as test (the sanitizer suite is on by default;
#                                    TANDEM_SANITIZE=0 ... test skips it)
#   bash tools/quickstart.sh agents  set up, build, serve config/examples/agents.toml (sim
#                                    device, MiniMax-M2 chat format) for coding agents
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
mode="${1:-}"
case "$mode" in
  serve|test|agents) ;;
  sanitize) mode=test; TANDEM_SANITIZE=1 ;;
  *) echo "usage: bash tools/quickstart.sh serve|test|sanitize|agents" >&2; exit 2 ;;
esac

bash tools/setup.sh
# -g1 (line tables only): backtraces keep files and lines, and the build takes ~25% less time
# than with full -g (measured on router_actor.cpp: 6.6 s vs 8.8 s of CPU). Reconfigure with
# `meson configure build -Dcpp_args=` for a debugger's full view.
if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=debugoptimized -Dcpp_args=-g1
fi
ninja -C build
bash tools/setup.d/40-agents-model.sh   # needs the built tandem (agents.toml's model)

if [ "$mode" = serve ]; then
  exec build/tools/tandem up config/examples/local.toml
fi
if [ "$mode" = agents ]; then
  exec build/tools/tandem up config/examples/agents.toml
fi

# Two tests at a time (both cores); the integration tests that load the machine are
# is_parallel: false in tests/meson.build, so they run alone.
set +e
meson test -C build --num-processes 2 --print-errorlogs --no-rebuild
rc=$?
set -e

# The same suite under AddressSanitizer (+ LeakSanitizer) and UndefinedBehaviorSanitizer,
# both fatal, in a second build directory (build-asan/). On by default (`.ci/run` runs it);
# TANDEM_SANITIZE=0 skips it for a quick local loop. Its suite runs two tests at a time: each
# test is CPU-bound under ASan (real time = user + sys), so two use both cores, and test ports
# come from outside the ephemeral range (tests/support/process.hpp free_port), so parallel
# tests cannot take each other's.
# Tests in suite 'nosan' are left out (each says why in tests/meson.build). Every
# sanitized process, test or `tandem` child, writes its ASan and LSan reports to
# build-asan/sanitizer/; any report there fails the run (a leak found when a child exits would
# otherwise vanish with its stderr and exit code). UBSan runs inside ASan's runtime and reports
# on stderr; -fno-sanitize-recover + halt_on_error + abort_on_error make the process abort,
# so the test fails. No UBSan suppressions: findings are fixed.
# -Dwerror=false here only: GCC 12's sanitizer instrumentation makes false warnings (e.g.
# -Wmaybe-uninitialized on runtime/node/bridge.cpp's std::optional<MallocMessageBuilder>
# at -O1); the same code is held to -Werror by the g++ build above.
# -Og -g1: this build's CPU time is about half of -O1 -g (router_actor.cpp: 8.4 s vs 16.2 s),
# while the code still runs optimized enough for the integration tests; line tables keep
# the sanitizers' reports symbolized with files and lines.
asan_rc=0
asan_logs=()
if [ "${TANDEM_SANITIZE:-1}" = 1 ]; then
  if [ ! -f build-asan/build.ninja ]; then
    meson setup build-asan --buildtype=debug -Doptimization=g -Dwerror=false \
      -Db_sanitize=address,undefined -Db_lundef=false \
      "-Dcpp_args=-fno-sanitize-recover=undefined -g1"
  fi
  nice -n 10 ninja -C build-asan
  reports="$here/build-asan/sanitizer"
  rm -rf "$reports"
  mkdir -p "$reports"
  set +e
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$reports/asan" \
  LSAN_OPTIONS="suppressions=$here/tests/sanitizers/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1" \
    meson test -C build-asan --num-processes 2 --print-errorlogs --no-rebuild --no-suite nosan \
    --timeout-multiplier 4
  asan_rc=$?
  set -e
  python3 tools/sanitizer-reports.py "$reports" > build-asan/sanitizer-log.json || asan_rc=1
  asan_logs=(build-asan/meson-logs/testlog.json build-asan/sanitizer-log.json)
else
  echo "quickstart: TANDEM_SANITIZE=0: the sanitizer suite (build-asan) is not run"
fi

# Fuzzing: bounded, with clang's libFuzzer; skipped (said so) when clang is not installed.
fuzz_logs=()
fuzz_rc=0
if command -v clang++ >/dev/null 2>&1; then
  bash tools/fuzz-run.sh "${FUZZ_SECONDS:-30}" || fuzz_rc=$?
  fuzz_logs=(build-fuzz/fuzz-log.json)
else
  echo "quickstart: clang++ not installed: fuzz targets not fuzzed (replayed in the suite only)"
fi

summary_rc=0
python3 tools/test-summary.py build/meson-logs/testlog.json "${asan_logs[@]}" \
  "${fuzz_logs[@]}" || summary_rc=$?
if [ $rc -ne 0 ] || [ $asan_rc -ne 0 ] || [ $fuzz_rc -ne 0 ] || [ $summary_rc -ne 0 ]; then
  exit 1
fi
