"""Checks the files of a profiled titan run (tests/e2e/test_profiling.sh).

usage: profiling_check.py DUMP_FOLDER RANKS WINDOW_ENDS [--traces SPAN...] [--memory]

Traces: <dump>/profile_traces/iteration_<N>/rank<R>_trace.json parse as Chrome trace JSON and
hold "ProfilerStep#<N>" (not the warm-up step before it), ATen ops and every span given, where a
span ending in '*' matches any name with that prefix.
Memory: <dump>/memory_snapshot/iteration_<N>/rank<R>_memory_timeline.json hold the steps of the
window, each with data, forward, backward and optimizer phases (and collectives with several
ranks), whose bytes add up.
"""
import json
import sys


def fail(msg):
    print("profiling_check: " + msg, file=sys.stderr)
    sys.exit(1)


def check_trace(path, step, spans):
    with open(path) as f:
        trace = json.load(f)
    names = {e.get("name") for e in trace.get("traceEvents", []) if isinstance(e, dict)}
    names.discard(None)
    if f"ProfilerStep#{step}" not in names:
        fail(f"{path}: no ProfilerStep#{step}")
    if f"ProfilerStep#{step - 1}" in names:
        fail(f"{path}: the warm-up step {step - 1} was recorded")
    if not any(n.startswith("aten::") for n in names):
        fail(f"{path}: no ATen ops")
    for span in spans:
        if span.endswith("*"):
            ok = any(n.startswith(span[:-1]) for n in names)
        else:
            ok = span in names
        if not ok:
            fail(f"{path}: no span '{span}' (spans seen: "
                 f"{sorted(n for n in names if not n.startswith('aten::'))[:40]})")


def check_timeline(path, rank, ranks, steps):
    with open(path) as f:
        t = json.load(f)
    if t.get("format") != "titan-memory-timeline" or t.get("rank") != rank:
        fail(f"{path}: not rank {rank}'s memory timeline")
    got = [s["step"] for s in t["steps"]]
    if got != steps:
        fail(f"{path}: steps {got}, want {steps}")
    for s in t["steps"]:
        phases = s["phases"]
        wanted = ("data", "forward", "backward", "optimizer") + (("collective",) if ranks > 1 else ())
        for p in wanted:
            if p not in phases or phases[p]["entries"] < 1:
                fail(f"{path}: step {s['step']} has no {p} phase")
        net = sum(p["net_bytes"] for p in phases.values())
        if net != s["end_bytes"] - s["start_bytes"]:
            fail(f"{path}: step {s['step']}: phases add {net} bytes, the step "
                 f"{s['end_bytes'] - s['start_bytes']}")
        peak = max(p["peak_bytes"] for p in phases.values())
        if peak != s["peak_bytes"] or peak < max(s["start_bytes"], s["end_bytes"]):
            fail(f"{path}: step {s['step']}: peak {s['peak_bytes']} inconsistent")
        if phases["forward"]["net_bytes"] <= 0:
            fail(f"{path}: step {s['step']}: forward kept no activations")
        if len(s["segments"]) < 5:
            fail(f"{path}: step {s['step']}: {len(s['segments'])} segments")


def main():
    dump, ranks, ends = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
    args = sys.argv[4:]
    spans, memory = None, False
    while args:
        a = args.pop(0)
        if a == "--memory":
            memory = True
        elif a == "--traces":
            spans = []
            while args and not args[0].startswith("--"):
                spans.append(args.pop(0))
    prev = 0
    for end in ends:
        for rank in range(ranks):
            if spans is not None:
                check_trace(f"{dump}/profile_traces/iteration_{end}/rank{rank}_trace.json", end,
                            spans)
            if memory:
                check_timeline(
                    f"{dump}/memory_snapshot/iteration_{end}/rank{rank}_memory_timeline.json",
                    rank, ranks, list(range(prev + 1, end + 1)))
        prev = end
    print(f"profiling_check: {dump}: {ranks} ranks, windows {ends} ok")


main()
