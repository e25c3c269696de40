#!/usr/bin/env python3
"""Counts test cases across the suite from meson's testlog.json.

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
with open(sys.argv[1], encoding="utf-8") as log:
    for line in log:
        entry = json.loads(line)
        out = entry.get("stdout", "") or ""
        result = entry.get("result")
        if result == "SKIP":
            skipped += 1
            print(f"SKIPPED: {entry.get('name')}")
            continue
        if result == "EXPECTEDFAIL":
            expected_failures += 1
            print(f"EXPECTED FAILURE: {entry.get('name')}")
            continue
        ok = result == "OK"
        found = SUMMARY.findall(out)
        if found:
            _, p, f, s = found[-1]
            passed += int(p)
            failed += int(f)
            skipped += int(s or 0)
            if not ok and int(f) == 0:
                failed += 1  # crashed after its summary, or leaked a non-zero exit
        elif ok:
            passed += 1
        else:
            failed += 1
            print(f"FAILED: {entry.get('name')} ({result})")
if expected_failures:
    print(f"{expected_failures} expected failures")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
