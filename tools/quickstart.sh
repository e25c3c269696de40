#!/usr/bin/env bash
# The README's two commands:
#   bash tools/quickstart.sh serve   set up, build, start the local cluster (API on 127.0.0.1:8000)
#   bash tools/quickstart.sh test    set up, build, run the whole test suite with g++ (build/,
#                                    release), then again under ASan + UBSan + LSan and each
#                                    fuzz target for FUZZ_SECONDS (default 30), both from one
#                                    clang build (build-san/; skip with TANDEM_SANITIZE=0);
#                                    tools/status-check; the time of each phase
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

# Each phase's wall time, printed at the end of `test` (CI keeps the end of the output).
phase_names=()
phase_seconds=()
phase_started=$SECONDS
phase_name=""
phase() {  # phase NAME: ends the running phase, starts NAME
  if [ -n "$phase_name" ]; then
    phase_names+=("$phase_name")
    phase_seconds+=($((SECONDS - phase_started)))
  fi
  phase_name="$1"
  phase_started=$SECONDS
}
phases_line() {
  phase ""
  local line="phases:" i total=0
  for i in "${!phase_names[@]}"; do
    line+=" ${phase_names[$i]} ${phase_seconds[$i]} s,"
    total=$((total + phase_seconds[$i]))
  done
  echo "${line%,}; total $((total / 60)) min $((total % 60)) s"
}

phase setup
bash tools/setup.sh
# ccache keys on paths relative to the checkout and not on the build directory, so a second
# clone (CI's fresh one) or a build after a pull reuses what an earlier build compiled. The
# line tables then name the first checkout's directory, which backtraces only print.
export CCACHE_BASEDIR="$here" CCACHE_NOHASHDIR=1
# -g1 (line tables only): backtraces keep files and lines, and the build takes ~25% less time
# than with full -g (measured on router_actor.cpp: 6.6 s vs 8.8 s of CPU). Reconfigure with
# `meson configure build -Dcpp_args=` for a debugger's full view.
# The release build (-O3), the one an operator runs, with its assertions kept
# (-Db_ndebug=false: RT_ASSERT and assert stay on). ccache (installed by setup; meson finds it)
# makes a second build of the same sources nearly free.
if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=release -Db_ndebug=false -Dcpp_args=-g1
fi
phase build
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
phase suite
set +e
meson test -C build --num-processes 2 --print-errorlogs --no-rebuild
rc=$?
set -e

# The sanitizer build (build-san/), one build for two jobs: the suite again under
# AddressSanitizer (+ LeakSanitizer) and UndefinedBehaviorSanitizer, both fatal, and the
# libFuzzer targets (tests/fuzz), fuzzed for FUZZ_SECONDS each (default 30) by
# tools/fuzz-run.sh. clang builds it: libFuzzer is clang's, and its coverage instrumentation
# (-fsanitize=fuzzer-no-link) goes into every library so the fuzz targets link against the
# same objects the suite runs. On by default (`.ci/run` runs it); TANDEM_SANITIZE=0 skips it
# for a quick local loop. clang missing is a failure, never a silent skip (setup installs it).
# Its suite runs two tests at a time: each test is CPU-bound under ASan (real time = user +
# sys), so two use both cores, and test ports come from outside the ephemeral range
# (tests/support/process.hpp free_port), so parallel tests cannot take each other's.
# Tests in suite 'nosan' are left out (each says why in tests/meson.build). Every sanitized
# process, test or `tandem` child, writes its ASan and LSan reports to build-san/sanitizer/;
# any report there fails the run (a leak found when a child exits would otherwise vanish with
# its stderr and exit code). UBSan runs inside ASan's runtime; -fno-sanitize-recover +
# halt_on_error + abort_on_error make the process abort, so the test fails. No UBSan
# suppressions: findings are fixed.
# -Dwerror=false here only: the same code is held to -Werror by the g++ release build above,
# and clang's warning set is not the one the project is held to.
# -O1 -g1: optimized enough for the integration tests; line tables keep the sanitizers'
# reports symbolized with files and lines.
asan_rc=0
fuzz_rc=0
san_logs=()
if [ "${TANDEM_SANITIZE:-1}" = 1 ]; then
  phase build-san
  if ! command -v clang++ >/dev/null 2>&1; then
    echo "quickstart: clang++ is not installed (tools/setup.sh installs clang): the sanitizer" \
      "suite and the fuzz targets cannot run" >&2
    asan_rc=1
    san_logs=(build-san/meson-logs/testlog.json)  # missing: counted as failed
  else
    if [ ! -f build-san/build.ninja ]; then
      cxx="clang++"
      if command -v ccache >/dev/null 2>&1; then cxx="ccache clang++"; fi
      CXX="$cxx" meson setup build-san --buildtype=debug -Doptimization=1 -Dfuzz=true \
        -Dwerror=false -Db_sanitize=address,undefined -Db_lundef=false \
        "-Dcpp_args=-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined -g1"
    fi
    nice -n 10 ninja -C build-san
    phase suite-san
    reports="$here/build-san/sanitizer"
    rm -rf "$reports"
    mkdir -p "$reports"
    set +e
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$reports/asan" \
    LSAN_OPTIONS="suppressions=$here/tests/sanitizers/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1" \
      meson test -C build-san --num-processes 2 --print-errorlogs --no-rebuild --no-suite nosan \
      --timeout-multiplier 4
    asan_rc=$?
    set -e
    python3 tools/sanitizer-reports.py "$reports" > build-san/sanitizer-log.json || asan_rc=1
    phase fuzz
    FUZZ_BUILD=build-san bash tools/fuzz-run.sh "${FUZZ_SECONDS:-30}" || fuzz_rc=$?
    san_logs=(build-san/meson-logs/testlog.json build-san/sanitizer-log.json
              build-san/fuzz-log.json)
  fi
else
  echo "quickstart: TANDEM_SANITIZE=0: the sanitizer suite and the fuzz targets (build-san)" \
    "are not run"
fi

# STATUS names only tests that exist and benchmark sections that are written.
phase status-check
status_rc=0
python3 tools/status-check build || status_rc=$?

phases_line
summary_rc=0
python3 tools/test-summary.py build/meson-logs/testlog.json "${san_logs[@]}" || summary_rc=$?
if [ $rc -ne 0 ] || [ $asan_rc -ne 0 ] || [ $fuzz_rc -ne 0 ] || [ $status_rc -ne 0 ] ||
   [ $summary_rc -ne 0 ]; then
  exit 1
fi
