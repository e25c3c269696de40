#!/usr/bin/env python3
"""`tandem sim --faults ... --seed N` replays byte for byte, prints the seed first, and a bad
fault term is an error naming it (exit 2). Argument: the tandem binary."""
import subprocess
import sys

tandem = sys.argv[1]
args = [tandem, 'sim', '--prefill', '1', '--decode', '3', '--sessions', '4',
        '--sessions-total', '8', '--duration-s', '30', '--block-tokens', '256',
        '--request-timeout-ms', '10000', '--prefill-timeout-ms', '3000',
        '--faults', 'crash:decode-0@3s+5s,partition:prefill-0/decode-1@2s+2s,'
        'slow:decode-2x4@0s+10s,random:loss=0.1', '--seed', '42']
runs = [subprocess.run(args, capture_output=True, text=True, timeout=600) for _ in range(2)]
for r in runs:
    if r.returncode != 0:
        sys.exit(f'exit {r.returncode}: {r.stdout}\n{r.stderr}')
a, b = runs[0].stdout, runs[1].stdout
lines = a.splitlines()
if lines[0] != 'seed 42' or not lines[1].startswith('faults: ') or \
        'crash:decode-0@3000ms+5000ms' not in lines[1]:
    sys.exit('the seed and the fault plan must come first:\n' + a)
if a != b:
    sys.exit('two runs of the same seed differ:\n' + a + '\n----\n' + b)
bad = subprocess.run([tandem, 'sim', '--faults', 'crash:decode-0@1s,crash:decode-0@1'],
                     capture_output=True, text=True, timeout=60)
if bad.returncode != 2 or "term 2 'crash:decode-0@1'" not in bad.stderr:
    sys.exit(f'a bad term: exit {bad.returncode}, stderr {bad.stderr!r}')
print('ok: replayed byte for byte;', a.splitlines()[2])
