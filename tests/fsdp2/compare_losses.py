#!/usr/bin/env python3
"""Compares the `step N loss X` lines of two runs of launch/train_fsdp2.py over a step range:
  compare_losses.py REFERENCE.log RESUMED.log --steps 21-30 (--exact | --rtol 1e-5)
--exact: the printed floats are the same strings (a bit-exact resume); --rtol: within that
relative difference (another world size: only the order of float reductions differs). Every
step of the range must be in both logs, and the resumed log must print no earlier step."""
import argparse
import re
import sys

LINE = re.compile(r"^step (\d+) loss (\S+)$")


def losses(path):
    found = {}
    with open(path) as f:
        for line in f:
            match = LINE.match(line.strip())
            if match:
                found[int(match.group(1))] = match.group(2)
    return found


def main():
    p = argparse.ArgumentParser()
    p.add_argument("reference")
    p.add_argument("resumed")
    p.add_argument("--steps", required=True, help="FIRST-LAST")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--exact", action="store_true")
    how.add_argument("--rtol", type=float)
    args = p.parse_args()
    first, last = (int(v) for v in args.steps.split("-"))
    ref, got = losses(args.reference), losses(args.resumed)
    problems = []
    early = sorted(s for s in got if s < first)
    if early:
        problems.append("the resumed run printed steps before %d: %s" % (first, early))
    worst = 0.0
    for step in range(first, last + 1):
        if step not in ref or step not in got:
            problems.append("step %d: missing from %s" % (
                step, args.reference if step not in ref else args.resumed))
            continue
        a, b = ref[step], got[step]
        rel = abs(float(a) - float(b)) / max(abs(float(a)), 1e-30)
        worst = max(worst, rel)
        if (args.exact and a != b) or (not args.exact and not rel <= args.rtol):
            problems.append("step %d: loss %s, uninterrupted %s (relative %.3g)" % (step, b, a, rel))
    for problem in problems:
        print(problem)
    print("steps %d-%d: %s, largest relative difference %.3g" % (
        first, last, "FAILED" if problems else ("identical" if args.exact else "within %g" % args.rtol), worst))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
