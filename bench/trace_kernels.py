#!/usr/bin/env python3
"""The GPU kernels of a profiler trace (titan's profiling.enable_profiling, or PyTorch's), by
total time: where a step's device time goes, e.g. to compare bf16 with float8 runs.

    bench/trace_kernels.py TRACE.json [--top 25]

Prints the device time of all kernels, then the top kernels with their time, share and count.
"""
import argparse
import collections
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--width", type=int, default=100, help="kernel names cut to this width")
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f).get("traceEvents", [])
    total = collections.Counter()
    count = collections.Counter()
    for e in events:
        if e.get("cat") != "kernel" or e.get("ph") != "X":
            continue
        name = e.get("name", "?")[: args.width]
        total[name] += float(e.get("dur", 0.0))
        count[name] += 1
    all_us = sum(total.values())
    if not all_us:
        print(f"trace_kernels: no GPU kernel events in {args.trace}", file=sys.stderr)
        return 1
    print(f"{args.trace}: {sum(count.values())} kernels, {all_us / 1e3:.2f} ms of device time")
    for name, us in total.most_common(args.top):
        print(f"{us / 1e3:10.2f} ms {100 * us / all_us:5.1f}% x{count[name]:5d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
