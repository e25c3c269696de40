#!/usr/bin/env python3
"""One markdown table row for bench/run-target-4p4d.sh.

  target_4p4d_compare.py agree LABEL REAL_JSON SIM_JSON [CPU_FILE]
  target_4p4d_compare.py real  LABEL REAL_JSON [CPU_FILE]

REAL_JSON: `tandem bench serve --json`; SIM_JSON: `tandem sim --json --timelines`.
"matched": the requests both runs completed (a trace request is identified by its turn and
prompt length), so the percentiles compare the same requests, not just the same workload.
"""
import json
import sys


def pct(values, p):
    """numpy-style linear interpolation, as tools/workload/bench_metrics."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def cpu(path):
    try:
        words = open(path).read().split()
        return f"{float(words[3]) + float(words[6]):.0f} s / {float(words[9]):.0f} s"
    except (OSError, IndexError, ValueError):
        return "-"


def real_ttfts(real):
    out = {}
    for r in real["requests"]:
        if r["error"] == "" and r["chunks_count"] > 0:
            out[(r["turn"], r["prompt_tokens"])] = r["first_chunk_ms"] - r["send_ms"]
    return out


def sim_ttfts(sim):
    out = {}
    for t in sim.get("timelines", []):
        if t["error"] == "" and t["chunk_ms"]:
            out[(t["turn"], t["prompt_tokens"])] = t["chunk_ms"][0] - t["send_ms"]
    return out


def main():
    mode, label, real = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
    rs = real["summary"]
    # The requests' usage.cached_tokens (the sim's definition); older results: /metrics.
    hit = (real["prefix_cache"].get("request_hit_rate")
           or real["prefix_cache"].get("hit_rate") or 0)
    if mode == "real":
        cells = [label, rs["requests_count"], rs["failed_count"],
                 f'{rs["ttft_ms"]["p50"]:.0f}', f'{rs["ttft_ms"]["p90"]:.0f}',
                 f'{rs["tpot_ms"]["p50"]:.1f}', f'{rs["output_token_throughput_per_s"]:.0f}',
                 f"{hit:.3f}", cpu(sys.argv[4] if len(sys.argv) > 4 else "")]
    else:
        sim = json.load(open(sys.argv[4]))
        ss = sim["summary"]
        a, b = real_ttfts(real), sim_ttfts(sim)
        both = sorted(set(a) & set(b))
        m_real = pct([a[k] for k in both], 50)
        m_sim = pct([b[k] for k in both], 50)
        cells = [label, rs["requests_count"], ss["requests"], len(both),
                 f'{ss["ttft_ms"]["p50"]:.0f}', f'{rs["ttft_ms"]["p50"]:.0f}',
                 f'{rs["ttft_ms"]["p50"] / ss["ttft_ms"]["p50"]:.2f}',
                 f"{m_sim:.0f}", f"{m_real:.0f}", f"{m_real / m_sim:.2f}",
                 f'{ss["ttft_ms"]["p90"]:.0f}', f'{rs["ttft_ms"]["p90"]:.0f}',
                 f'{ss["tpot_ms"]["p50"]:.1f}', f'{rs["tpot_ms"]["p50"]:.1f}',
                 rs["failed_count"], cpu(sys.argv[5] if len(sys.argv) > 5 else "")]
    print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
