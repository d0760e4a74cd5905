"""The long run of the command-line fuzzer: N generated inputs (default 10,000), each in a
child process batch so that a crash of the interpreter is counted too. Prints the outcomes by
input kind and every distinct failure with its reproduction (kind, argv, files).

    python benchmarks/fuzz_cli.py [--cases 10000] [--seed 1] [--batch 250]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.fuzzing import cases, run_case
seed, start, count = {seed}, {start}, {count}
tmp = Path(tempfile.mkdtemp())
for i, case in enumerate(cases(seed, start + count)[start:], start=start):
    r = run_case(case, tmp / str(i))
    print(json.dumps({{"i": i, "kind": case.kind, "outcome": r.outcome.value, "code": r.code,
                      "seconds": round(r.seconds, 3), "argv": case.argv,
                      "detail": r.detail if r.outcome.value != "ok" else ""}}), flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch", type=int, default=250)
    args = parser.parse_args()
    counts: collections.Counter = collections.Counter()
    failures, start_time = [], time.perf_counter()
    for start in range(0, args.cases, args.batch):
        count = min(args.batch, args.cases - start)
        code = CHILD.format(repo=str(REPO), seed=args.seed, start=start, count=count)
        with tempfile.TemporaryDirectory():
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        for r in records:
            counts[(r["kind"], r["outcome"])] += 1
            if r["outcome"] != "ok":
                failures.append(r)
        if proc.returncode != 0:          # the interpreter died: the next case is the culprit
            counts[("?", "crash")] += 1
            failures.append({"i": start + len(records), "outcome": "crash",
                             "detail": proc.stderr[-2000:]})
        done = start + count
        print(f"{done:,}/{args.cases:,} cases, {sum(1 for f in failures):,} failures, "
              f"{time.perf_counter() - start_time:.0f} s", file=sys.stderr, flush=True)
    print(f"{args.cases:,} cases (seed {args.seed}) in {time.perf_counter() - start_time:.0f} s")
    for (kind, outcome), n in sorted(counts.items()):
        print(f"  {kind:10s} {outcome:10s} {n:6,d}")
    by_outcome = collections.Counter(f["outcome"] for f in failures)
    print(f"tracebacks {by_outcome['traceback']}, past the time limit {by_outcome['slow']}, "
          f"crashes {by_outcome['crash']}")
    seen = set()
    for f in failures:
        key = (f["outcome"], (f.get("detail") or "").strip().splitlines()[-1:] and
               f["detail"].strip().splitlines()[-1][:120])
        if key not in seen:
            seen.add(key)
            print(f"\n--- case {f['i']} ({f.get('kind')}, {f['outcome']}): {f.get('argv')}\n"
                  f"{(f.get('detail') or '')[-1200:]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
