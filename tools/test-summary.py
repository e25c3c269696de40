#!/usr/bin/env python3
"""Counts test cases across the suite from meson's testlog.json files.

usage: test-summary.py TESTLOG.json [TESTLOG.json ...]: several logs (the g++ build, the
sanitizer build, the fuzz runs) are summed into one closing line. A log that is missing or
unreadable counts as one failed case (its tests did not run).

doctest executables report their own case counts (passed, failed, skipped); any other test
counts as one case. A test executable that failed without a doctest summary (crash, timeout)
counts as one failed case. A test meson skipped (exit 77) counts as skipped, an expected
failure as failed-as-expected: neither counts as passed. Prints 'N passed, N failed, N skipped'
as the last line (', N expected failures' before it when there are some); exits 1 if anything
failed."""
import json
import re
import sys

SUMMARY = re.compile(
    r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed(?:\s*\|\s*(\d+) skipped)?")

passed = failed = skipped = expected_failures = 0
# Why each failed test failed, printed just before the closing line: CI often keeps only the
# end of a run's output, and the full log stays on the machine that ran it.
# MESSAGE: what a test printed about the failure (an answer's body); the node-log lines at
# warn or worse say what the cluster thought of it.
WHY = re.compile(r"(ERROR|FATAL|TEST CASE:|SUBCASE:|values:|MESSAGE:|Assertion|runtime error|"
                 r"AddressSanitizer|LeakSanitizer|timed out|Timeout|terminate called|Aborted|"
                 r"\] (?:warning|error|critical): )")
reasons = []


def note_reason(name, out):
    lines = [line[:240] for line in out.splitlines() if WHY.search(line)]
    if not lines:
        lines = [line[:240] for line in out.splitlines()[-8:]]
    reasons.append((name, lines[:40]))


def count_entry(entry, where):
    global passed, failed, skipped, expected_failures
    out = entry.get("stdout", "") or ""
    result = entry.get("result")
    name = f"{entry.get('name')}{where}"
    if result == "SKIP":
        skipped += 1
        print(f"SKIPPED: {name}")
        return
    if result == "EXPECTEDFAIL":
        expected_failures += 1
        print(f"EXPECTED FAILURE: {name}")
        return
    ok = result == "OK"
    found = SUMMARY.findall(out)
    if found:
        _, p, f, s = found[-1]
        passed += int(p)
        failed += int(f)
        skipped += int(s or 0)
        if not ok and int(f) == 0:
            failed += 1  # crashed after its summary, or leaked a non-zero exit
        if not ok:
            print(f"FAILED: {name} ({result})")
            note_reason(name, out)
    elif ok:
        passed += 1
    else:
        failed += 1
        print(f"FAILED: {name} ({result})")
        note_reason(name, out)


paths = sys.argv[1:]
if not paths:
    print("usage: test-summary.py TESTLOG.json [TESTLOG.json ...]", file=sys.stderr)
    sys.exit(2)
for path in paths:
    # With several logs, each failure names the log it came from.
    where = f" [{path}]" if len(paths) > 1 else ""
    try:
        with open(path, encoding="utf-8") as log:
            entries = [json.loads(line) for line in log if line.strip()]
    except (OSError, ValueError) as error:
        failed += 1
        print(f"FAILED: {path} (no readable test log: {error})")
        continue
    for entry in entries:
        count_entry(entry, where)
for name, lines in reasons:
    print(f"---- why {name} failed (the lines that say; the whole output is in its log):")
    for line in lines:
        print(f"  {line}")
if expected_failures:
    print(f"{expected_failures} expected failures")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
