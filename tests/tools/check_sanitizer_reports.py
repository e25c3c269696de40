#!/usr/bin/env python3
"""tools/sanitizer-reports.py (issue 12): a report file written by any sanitized process fails
the run and names the file; none is one passed entry; empty files (a process that opened its
log and found nothing) are not reports."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.environ.get("TANDEM_SOURCE_ROOT", "."), "tools", "sanitizer-reports.py")

# (files to write: name -> text, want rc, want entries as (name, result))
CASES = [
    ({}, 0, [("sanitizer reports (none)", "OK")]),
    ({"asan.123": ""}, 0, [("sanitizer reports (none)", "OK")]),
    ({"asan.123": "==123==ERROR: LeakSanitizer: detected memory leaks\n", "other.txt": "x"}, 1,
     [("sanitizer report asan.123", "FAIL")]),
    ({"ubsan.7": "x.cpp:1:2: runtime error: signed integer overflow\n",
      "asan.8": "==8==ERROR: AddressSanitizer: heap-use-after-free\n"}, 1,
     [("sanitizer report asan.8", "FAIL"), ("sanitizer report ubsan.7", "FAIL")]),
]

problems = 0
for files, want_rc, want in CASES:
    with tempfile.TemporaryDirectory() as directory:
        for name, text in files.items():
            with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
                f.write(text)
        run = subprocess.run([sys.executable, SCRIPT, directory], capture_output=True, text=True)
    got = [(e["name"], e["result"]) for e in map(json.loads, run.stdout.splitlines())]
    if got != want or run.returncode != want_rc:
        problems += 1
        print(f"FAIL {sorted(files)}: got {got} rc {run.returncode}, want {want} rc {want_rc}")
print(f"{len(CASES) - problems} passed, {problems} failed")
sys.exit(1 if problems else 0)
