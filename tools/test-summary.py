#!/usr/bin/env python3
"""Counts test cases across the suite from meson's testlog.json.

doctest executables report their own case counts; any other test counts as one case.
A test executable that failed without a doctest summary (crash, timeout) counts as one
failed case. Prints 'N passed, N failed' as the last line; exits 1 if anything failed."""
import json
import re
import sys

SUMMARY = re.compile(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed")

passed = failed = 0
with open(sys.argv[1], encoding="utf-8") as log:
    for line in log:
        entry = json.loads(line)
        out = entry.get("stdout", "") or ""
        ok = entry.get("result") in ("OK", "EXPECTEDFAIL", "SKIP")
        found = SUMMARY.findall(out)
        if found:
            _, p, f = found[-1]
            passed += int(p)
            failed += int(f)
            if not ok and int(f) == 0:
                failed += 1  # crashed after its summary, or leaked a non-zero exit
        elif ok:
            passed += 1
        else:
            failed += 1
            print(f"FAILED: {entry.get('name')} ({entry.get('result')})")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
