"""kill -9 of the server while its disk cache writes, in a loop (tests/kill9.py).

Each round restarts the server on the same cache directory and checks it (healthy,
within max_bytes, no temp file after the start, the reference answer equal to the
first one served the same way), fires requests whose prompts get saved, and SIGKILLs
the process (odd rounds at a random moment, even rounds as soon as a temp file
appears, i.e. inside a write). Exit 1 on any problem.

    flock /tmp/llamaserve-bench.lock python bench/kill9.py --rounds 25
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import kill9  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        report = kill9.run(args.rounds, Path(tmp), seed=args.seed)
    print(f"kill -9 rounds survived: {report.rounds}; restarts healthy: {report.started} "
          f"(of {args.rounds + 1}); kills that left a partial temp file (mid-write): "
          f"{report.mid_write}")
    print(f"largest cache seen: {report.max_seen_bytes} bytes (max_bytes {kill9.MAX_BYTES}); "
          f"corrupt files found at start: {report.rejected:g}; reference answers from a "
          f"disk prefix: {report.disk_hits}; mismatches: {report.mismatches}; "
          f"{time.monotonic() - started:.0f} s")
    for problem in report.problems:
        print("PROBLEM:", problem)
    return 0 if not report.problems and report.started == args.rounds + 1 else 1


if __name__ == "__main__":
    sys.exit(main())
