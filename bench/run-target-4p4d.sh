#!/usr/bin/env bash
# Sim vs real on target-4p4d (issue 5; docs/benchmarks.md, "Sim vs real (target-4p4d)").
#
# For each concurrency C: start the local copy of the cluster (config/examples/
# target-4p4d-local.toml: 4 nodes on 127.0.0.1, sim devices at time factor 1), replay an
# agentic workload on it with `tandem bench serve` (completions API, token-id prompts,
# C sessions in flight), stop it, then replay the very same trace (--write-trace) with
# `tandem sim --manifest config/examples/target-4p4d.toml`. Writes into OUT_DIR:
#   trace-cC.jsonl  real-cC.json  real-cC.txt  cluster-cC.log  cluster-cC.time
#   sim-cC.json     sim-cC.txt    summary.md (the comparison table)
#
# Usage: bench/run-target-4p4d.sh [OUT_DIR]    (default: ${TMPDIR:-/tmp}/tandem-target-4p4d-<time>)
# Environment (defaults):
#   MODE=agree          agree: sim vs real, P/D, prefix-aware (the manifests as they are)
#                       variants: real cluster only, manifest rewritten per variant:
#                       pd-vs-agg (P/D vs 8 aggregated instances), policy (prefix-aware vs
#                       round-robin)
#   CONCURRENCY="4 8 16"  DURATION_S=60  SEED=1  TURNS_MIN=12  TURNS_MAX=24
#   SESSIONS_PER_SLOT=2   sessions generated = C x this
#   LINK_GB_PER_S=auto    the sim's prefill -> decode link; auto = what the local cluster
#                         moves: loopback RMA rate / kv_scale (see docs/benchmarks.md)
#   LOOPBACK_GB_PER_S=1.5 loopback RMA rate used by LINK_GB_PER_S=auto
#   TANDEM=build/tools/tandem   HTTP=127.0.0.1:8044 (the local manifest's gateway)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TANDEM="${TANDEM:-$ROOT/build/tools/tandem}"
MODE="${MODE:-agree}"
CONCURRENCY="${CONCURRENCY:-4 8 16}"
DURATION_S="${DURATION_S:-60}"
SEED="${SEED:-1}"
TURNS_MIN="${TURNS_MIN:-12}"
TURNS_MAX="${TURNS_MAX:-24}"
SESSIONS_PER_SLOT="${SESSIONS_PER_SLOT:-2}"
LOOPBACK_GB_PER_S="${LOOPBACK_GB_PER_S:-1.5}"
LINK_GB_PER_S="${LINK_GB_PER_S:-auto}"
HTTP="${HTTP:-127.0.0.1:8044}"
LOCAL="$ROOT/config/examples/target-4p4d-local.toml"
TARGET="$ROOT/config/examples/target-4p4d.toml"
OUT="${1:-${TMPDIR:-/tmp}/tandem-target-4p4d-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

die() { echo "run-target-4p4d: $*" >&2; exit 1; }
[[ -x "$TANDEM" ]] || die "no tandem binary at $TANDEM (ninja -C build tools/tandem)"
[[ -f "$ROOT/models/stories15M/tokenizer.bin" ]] || die "models/stories15M missing (tools/setup.sh)"

if [[ "$LINK_GB_PER_S" == auto ]]; then
  KV_SCALE="$(awk -F= '/^kv_scale/ {split($2, v, "#"); print v[1] + 0}' "$LOCAL")"
  LINK_GB_PER_S="$(awk -v l="$LOOPBACK_GB_PER_S" -v s="$KV_SCALE" 'BEGIN {print l / s}')"
fi

CLUSTER_PID=""
stop_cluster() {
  [[ -n "$CLUSTER_PID" ]] || return 0
  # CLUSTER_PID is /usr/bin/time; stop its child, `tandem up`, so time reports the CPU use
  local up
  for up in $(pgrep -P "$CLUSTER_PID" || true); do kill -TERM "$up" 2>/dev/null || true; done
  wait "$CLUSTER_PID" 2>/dev/null || true
  CLUSTER_PID=""
}
trap stop_cluster EXIT

# start_cluster MANIFEST TAG: `tandem up` in the background (CPU time of the whole cluster
# in cluster-TAG.time), then waits for the gateway's /health.
start_cluster() {
  local manifest="$1" tag="$2"
  if curl -sf "http://$HTTP/health" >/dev/null 2>&1; then
    die "something already serves $HTTP (a cluster left running?); stop it first"
  fi
  /usr/bin/time -f "cluster cpu: user %U s, system %S s, wall %e s" -o "$OUT/cluster-$tag.time" \
    "$TANDEM" up "$manifest" --grace-ms 10000 >"$OUT/cluster-$tag.log" 2>&1 &
  CLUSTER_PID=$!
  for _ in $(seq 1 240); do
    if curl -sf "http://$HTTP/health" >/dev/null 2>&1; then
      sleep 2  # let heartbeats tell the router every instance's load
      return 0
    fi
    kill -0 "$CLUSTER_PID" 2>/dev/null || die "cluster exited; see $OUT/cluster-$tag.log"
    sleep 0.5
  done
  die "gateway $HTTP not healthy after 120 s; see $OUT/cluster-$tag.log"
}

# run_real MANIFEST TAG C: one bench serve run against a fresh cluster.
run_real() {
  local manifest="$1" tag="$2" c="$3"
  start_cluster "$manifest" "$tag"
  local trace_flag=(--write-trace "$OUT/trace-c$c.jsonl")
  [[ -f "$OUT/trace-c$c.jsonl" ]] && trace_flag=(--trace "$OUT/trace-c$c.jsonl")
  "$TANDEM" bench serve --target "$HTTP" --api completions --workload agentic \
    --concurrency "$c" --sessions $((c * SESSIONS_PER_SLOT)) --turns-min "$TURNS_MIN" \
    --turns-max "$TURNS_MAX" --vocab 32000 --seed "$SEED" --duration "$DURATION_S" \
    "${trace_flag[@]}" --json "$OUT/real-$tag.json" --no-progress \
    >"$OUT/real-$tag.txt" 2>&1 || echo "bench serve exited $? (see $OUT/real-$tag.txt)" >&2
  stop_cluster
}

run_sim() {
  local c="$1"
  "$TANDEM" sim --manifest "$TARGET" --trace "$OUT/trace-c$c.jsonl" --sessions "$c" \
    --duration-s "$DURATION_S" --seed "$SEED" --link-gb-per-s "$LINK_GB_PER_S" \
    --json "$OUT/sim-c$c.json" --timelines >"$OUT/sim-c$c.txt" 2>&1
}

# variant NAME: a copy of the local manifest in OUT with one change.
variant() {
  local name="$1"
  local file="$OUT/target-4p4d-local-$name.toml"
  case "$name" in
    pd) cp "$LOCAL" "$file" ;;
    # every prefill instance becomes a second decode instance (same executor and devices):
    # 8 instances that prefill locally and decode
    aggregated) sed -e 's/role = "prefill"/role = "decode"/' \
                    -e 's/name = "prefill-\([0-9]\)"/name = "decode-p\1"/' "$LOCAL" >"$file" ;;
    round-robin) sed 's/^policy = "prefix-aware"/policy = "round-robin"/' "$LOCAL" >"$file" ;;
    prefix-aware) cp "$LOCAL" "$file" ;;
    *) die "unknown variant $name" ;;
  esac
  sed -i "s#^path = \"../../models/stories15M\"#path = \"$ROOT/models/stories15M\"#" "$file"
  echo "$file"
}

row() { python3 "$ROOT/bench/target_4p4d_compare.py" "$@"; }

SUMMARY="$OUT/summary.md"
{
  echo "# target-4p4d: MODE=$MODE CONCURRENCY=\"$CONCURRENCY\" DURATION_S=$DURATION_S SEED=$SEED"
  echo "# TURNS=$TURNS_MIN..$TURNS_MAX SESSIONS_PER_SLOT=$SESSIONS_PER_SLOT sim link" \
       "$LINK_GB_PER_S GB/s; $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$SUMMARY"

case "$MODE" in
  agree)
    echo "| sessions | real requests | sim requests | matched | sim TTFT p50 ms |" \
         "real TTFT p50 ms | real/sim | matched sim p50 | matched real p50 | matched real/sim |" \
         "sim p90 | real p90 | sim TPOT p50 | real TPOT p50 | real failed |" \
         "cluster CPU / wall |" >>"$SUMMARY"
    echo "|$(printf ' --- |%.0s' $(seq 16))" >>"$SUMMARY"
    for c in $CONCURRENCY; do
      echo "== concurrency $c: real" >&2
      run_real "$(variant pd)" "c$c" "$c"
      echo "== concurrency $c: sim" >&2
      run_sim "$c"
      row agree "$c" "$OUT/real-c$c.json" "$OUT/sim-c$c.json" "$OUT/cluster-c$c.time" \
        >>"$SUMMARY"
      tail -n 1 "$OUT/cluster-c$c.time" >&2
    done ;;
  pd-vs-agg|policy)
    if [[ "$MODE" == pd-vs-agg ]]; then VARIANTS="pd aggregated"; else
      VARIANTS="prefix-aware round-robin"; fi
    echo "| variant, sessions | requests | failed | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms |" \
         "output tok/s | hit rate (usage.cached_tokens) | cluster CPU / wall |" >>"$SUMMARY"
    echo "|$(printf ' --- |%.0s' $(seq 9))" >>"$SUMMARY"
    for c in $CONCURRENCY; do
      for v in $VARIANTS; do
        echo "== concurrency $c: $v" >&2
        run_real "$(variant "$v")" "$v-c$c" "$c"
        row real "$v, $c" "$OUT/real-$v-c$c.json" "$OUT/cluster-$v-c$c.time" >>"$SUMMARY"
      done
    done ;;
  *) die "MODE must be agree, pd-vs-agg or policy" ;;
esac
cat "$SUMMARY"
