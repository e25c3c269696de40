#!/usr/bin/env bash
# Fuzzes the libFuzzer targets (tests/fuzz) for a bounded time each, with clang.
#   bash tools/fuzz-run.sh SECONDS [TARGET...]   (TARGET: manifest, frame, ...; default: all)
# Builds in FUZZ_BUILD (default build-fuzz; `quickstart.sh test` passes build-san, its
# sanitizer build, which has the fuzz targets too); sets up build-fuzz (clang, -Dfuzz=true,
# ASan + UBSan, UBSan fatal) when it is missing, and builds only the fuzz targets. Each target starts from its seed corpus (tests/fuzz/corpus/<name>,
# read only) and writes what it finds to build-fuzz/fuzz-corpus/<name>. A crash, leak,
# sanitizer report or timeout fails the run: the reproducer's path and bytes are printed,
# and the file is kept in build-fuzz/fuzz-artifacts/<name>/ (add it to the corpus with a fix).
# Writes build-fuzz/fuzz-log.json (one meson-testlog-style line per target) for
# tools/test-summary.py. Exit: 0 all clean, 1 a finding, 2 no clang/libFuzzer here.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
seconds="${1:?usage: bash tools/fuzz-run.sh SECONDS [TARGET...]}"
shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for source in tests/fuzz/fuzz_*.cpp; do
    name="$(basename "$source" .cpp)"
    targets+=("${name#fuzz_}")
  done
fi

probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  > "$probe/probe.cpp"
if ! command -v clang++ >/dev/null 2>&1 ||
   ! clang++ -fsanitize=fuzzer "$probe/probe.cpp" -o "$probe/probe" >/dev/null 2>&1; then
  echo "fuzz: clang++ with libFuzzer not available (tools/setup.sh installs it)" >&2
  exit 2
fi

bdir="${FUZZ_BUILD:-build-fuzz}"
if [ ! -f "$bdir/build.ninja" ]; then
  cxx="clang++"
  if command -v ccache >/dev/null 2>&1; then cxx="ccache clang++"; fi
  # -fsanitize=fuzzer-no-link: coverage for libFuzzer in every library the targets link.
  CXX="$cxx" meson setup "$bdir" --buildtype=debug -Doptimization=1 -Dfuzz=true \
    -Db_sanitize=address,undefined -Db_lundef=false \
    "-Dcpp_args=-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined -g1"
fi
ninja -C "$bdir" "${targets[@]/#/tests/fuzz_}"

log="$bdir/fuzz-log.json"
: > "$log"

# One target: fuzzes it, then writes its verdict to build-fuzz/fuzz-$name.result (OK or FAIL
# and the exit code) for the report below. Runs in the background, FUZZ_JOBS at a time.
fuzz_one() {
  local name="$1"
  local work="$bdir/fuzz-corpus/$name" artifacts="$bdir/fuzz-artifacts/$name"
  local out="$bdir/fuzz-$name.log" rc=0
  rm -rf "$artifacts"
  mkdir -p "$work" "$artifacts"
  # -timeout: one input running 120 s is a finding (a hang; generous, for loaded CI machines:
  # the tokenizer once took 25 s of wall time at load 19, 0.2 s CPU); -rss_limit_mb: 2 GiB.
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$bdir/tests/fuzz_$name" -max_total_time="$seconds" -timeout=120 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$work" "tests/fuzz/corpus/$name" \
    > "$out" 2>&1 || rc=$?
  echo "$rc" > "$bdir/fuzz-$name.result"
}

# Each target is single-threaded: FUZZ_JOBS (default: the number of cores) run at once, so
# the wall time is about SECONDS x targets / FUZZ_JOBS.
jobs_max="${FUZZ_JOBS:-$(nproc)}"
for name in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  echo "fuzz: fuzz_$name for ${seconds}s"
  rm -f "$bdir/fuzz-$name.result"
  fuzz_one "$name" &
done
wait

found=0
for name in "${targets[@]}"; do
  artifacts="$bdir/fuzz-artifacts/$name"
  out="$bdir/fuzz-$name.log"
  rc="$(cat "$bdir/fuzz-$name.result" 2>/dev/null || echo 127)"
  runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out" | grep -o '[0-9]*$' || true)"
  if [ "$rc" -eq 0 ]; then
    echo "fuzz: fuzz_$name clean, ${runs:-?} runs"
    result=OK
  else
    found=1
    result=FAIL
    echo "fuzz: fuzz_$name FAILED (exit $rc); $(grep -m1 'INFO: Seed:' "$out" || true)" \
      "(-seed=N repeats the run); the end of its log ($out):"
    tail -n 60 "$out"
    for reproducer in "$artifacts"/*; do
      [ -f "$reproducer" ] || continue
      echo "fuzz: reproducer $reproducer ($(stat -c %s "$reproducer") bytes), base64:"
      base64 -w 76 "$reproducer" | head -n 200
      echo "fuzz: replay with build/tests/fuzz_${name}_replay $reproducer"
    done
  fi
  python3 -c 'import json, sys; print(json.dumps({"name": sys.argv[1], "result": sys.argv[2],
    "stdout": sys.argv[3]}))' "fuzz_$name" "$result" "fuzzed ${seconds}s, ${runs:-?} runs" >> "$log"
done
exit "$found"
