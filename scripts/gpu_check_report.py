"""Helpers of scripts/gpu_check.sh (standard library only): reads titan's metrics.jsonl and the
PyTorch reference's JSON, compares loss curves, and writes the summary in Markdown.

    gpu_check_report.py parity GPU.jsonl CPU.jsonl --steps 10 --rtol 1e-4
    gpu_check_report.py speed metrics.jsonl --warmup 3 --tokens-per-step 8192 > speed.json
    gpu_check_report.py summary WORK_DIR OUT.md

WORK_DIR holds what gpu_check.sh wrote: stages.tsv (stage, status, seconds, note per line),
env.json (the machine), parity.json, shared_{fsdp2,tp2,pp2}.json, titan_bf16.json,
titan_float8.json, ref_eager.json, ref_compile.json; any of them may be missing (a stage that
failed or did not run).
"""
import argparse
import json
import math
import os
import sys


def read_rows(path):
    # metrics.jsonl rows with a training loss (not validation rows or resume markers), by step.
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "loss" in row and "step" in row:
                rows[int(row["step"])] = row
    return rows


def cmd_parity(a):
    gpu, cpu = read_rows(a.gpu), read_rows(a.cpu)
    steps = list(range(1, a.steps + 1))
    missing = [s for s in steps if s not in gpu or s not in cpu]
    result = {"steps": a.steps, "rtol": a.rtol, "missing_steps": missing}
    diffs = []
    for s in steps:
        if s in gpu and s in cpu:
            g, c = float(gpu[s]["loss"]), float(cpu[s]["loss"])
            rel = abs(g - c) / max(abs(c), 1e-12) if math.isfinite(g) and math.isfinite(c) else 1e9
            diffs.append({"step": s, "gpu": g, "cpu": c, "rel": rel})
    result["per_step"] = diffs
    result["max_rel"] = max((d["rel"] for d in diffs), default=None)
    result["ok"] = not missing and result["max_rel"] is not None and result["max_rel"] <= a.rtol
    print(json.dumps(result))
    return 0 if result["ok"] else 1


def memory_fields(rows):
    # The memory figures the trainer logs (memory_gib; on CUDA TorchTitan's memory/ fields, each
    # for its log window) over the whole run: the largest of each, the sum of the counters.
    out = {}
    for row in rows:
        for k, v in row.items():
            if not isinstance(v, (int, float)) or not k.startswith("mem"):
                continue
            if k.startswith("memory/num_"):
                out[k] = out.get(k, 0) + v
            else:
                out[k] = max(out.get(k, v), v)
    return out


def cmd_speed(a):
    rows = read_rows(a.metrics)
    if not rows:
        print(json.dumps({"error": "no loss rows in " + a.metrics}))
        return 1
    last = max(rows)
    result = {"last_step": last, "loss_first": rows[min(rows)]["loss"],
              "loss_last": rows[last]["loss"]}
    start = a.warmup if a.warmup in rows else None
    if start is not None and last > start and "elapsed_s" in rows[last]:
        seconds = float(rows[last]["elapsed_s"]) - float(rows[start]["elapsed_s"])
        result["timed_steps"] = last - start
        result["step_s"] = seconds / (last - start)
        result["tokens_per_s"] = (last - start) * a.tokens_per_step / seconds
    else:  # no per-step rows: the trainer's own figure for its last window
        result["tokens_per_s"] = float(rows[last].get("tps", 0.0))
    row = rows[last]
    tps_row, tflops_row = float(row.get("tps", 0.0)), float(row.get("tflops", 0.0))
    if tps_row > 0 and tflops_row > 0:
        flops_per_token = tflops_row * 1e12 / tps_row
        result["flops_per_token"] = flops_per_token
        result["tflops"] = flops_per_token * result["tokens_per_s"] / 1e12
        if float(row.get("mfu", 0.0)) > 0:
            result["peak_tflops"] = tflops_row * 100.0 / float(row["mfu"])
            result["mfu"] = 100.0 * result["tflops"] / result["peak_tflops"]
    result["memory"] = memory_fields(rows.values())
    result["finite"] = all(math.isfinite(float(r["loss"])) for r in rows.values())
    print(json.dumps(result))
    return 0 if result["finite"] else 1


def load(work, name):
    path = os.path.join(work, name)
    try:
        with open(path) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def fmt(value, spec):
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def fmt_tflops(value):
    # 3 significant digits below 100 (CPU dry runs), one decimal above (GPUs).
    if not isinstance(value, (int, float)):
        return "-"
    return format(value, ".1f") if value >= 100 else format(value, ".3g")


def memory_text(d):
    if not d:
        return "-"
    if "max_allocated_gib" in d:  # the PyTorch reference on a GPU
        return "max allocated %.1f GiB, reserved %.1f GiB" % (d["max_allocated_gib"],
                                                               d["max_reserved_gib"])
    if "peak_rss_gib" in d:  # the PyTorch reference on the CPU
        return "peak RSS %.2f GiB" % d["peak_rss_gib"]
    mem = d.get("memory") or {}
    if "memory/max_active(GiB)" in mem:  # titan on a GPU
        return ("max active %.1f GiB, reserved %.1f GiB (%.0f%%); alloc retries %d, OOMs %d" % (
            mem["memory/max_active(GiB)"], mem.get("memory/max_reserved(GiB)", 0.0),
            mem.get("memory/max_reserved(%)", 0.0), mem.get("memory/num_alloc_retries", 0),
            mem.get("memory/num_ooms", 0)))
    if "memory_gib" in mem:  # titan on the CPU
        return "peak RSS %.2f GiB" % mem["memory_gib"]
    return "-"


# What each stage measures, for the summary's list of what was measured where.
STAGE_FIGURES = {
    "unit": "the CUDA unit tests",
    "parity": "GPU vs CPU parity and the deterministic rerun",
    "shared_parallel": "FSDP 2 / TP 2 / PP 2 with ranks sharing one device vs one rank",
    "titan_bf16": "titan bf16 speed and memory",
    "ref_eager": "PyTorch eager speed and memory",
    "float8": "titan float8 speed and memory",
    "ref_compile": "PyTorch torch.compile speed and memory",
}


def measured_where(env, stages):
    # Which figures came from the GPU (or, in a dry run, the CPU) and which stages gave none, why.
    out = ["## What was measured where", ""]
    where = "the CPU (dry run, no GPU)" if env.get("dry_run") else "the GPU (%s)" % env.get(
        "gpu", "?")
    measured, missing = [], []
    for name, status, _, note in stages:
        if name not in STAGE_FIGURES:
            continue
        what = STAGE_FIGURES[name]
        if status == "ok":
            if name == "float8" and env.get("dry_run"):
                what += " (float8 emulated)"
            measured.append(what)
        else:
            missing.append("- %s (%s): **%s**%s" % (what, name, status, ": " + note if note else ""))
    out.append("Measured on %s: %s." % (where, "; ".join(measured) if measured else "nothing"))
    out.append("")
    if missing:
        out += ["Not measured (stage skipped, failed or not run):", ""] + missing + [""]
    wanted = [n for n in STAGE_FIGURES if n not in {s[0] for s in stages}]
    if wanted:
        out += ["Stages not in this run (--stages): %s." % ", ".join(wanted), ""]
    return out


def shared_parity_text(work, env):
    layouts = [(name, load(work, "shared_%s.json" % name)) for name in ("fsdp2", "tp2", "pp2")]
    layouts = [(name, d) for name, d in layouts if d]
    if not layouts:
        return []
    device = "CPU" if env.get("dry_run") else "GPU"
    parts = ["%s %s (%s)" % (name, fmt(d.get("max_rel"), ".2e"), "pass" if d.get("ok") else "FAIL")
             for name, d in layouts]
    return ["Shared-%s parallelism (2 ranks on one %s over Gloo, TITAN_SHARED_DEVICE=1, vs 1 rank; "
            "float32, debug model, %d steps): max relative loss difference %s (tolerance %g)." % (
                device, device, layouts[0][1]["steps"], ", ".join(parts),
                layouts[0][1]["rtol"]), ""]


def cmd_summary(a):
    work = a.work
    env = load(work, "env.json") or {}
    stages = []
    try:
        with open(os.path.join(work, "stages.tsv")) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 3:
                    stages.append(parts + [""] * (4 - len(parts)))
    except OSError:
        pass
    out = ["# titan.cpp GPU check", ""]
    if env.get("dry_run"):
        out += ["**CPU DRY RUN: no GPU was used.** The stages ran on the CPU with small sizes to "
                "exercise the script; no figure below is a GPU figure.", ""]
    out.append("- when: %s; host %s, %s CPU cores" % (env.get("date", "?"), env.get("host", "?"),
                                                     env.get("cores", "?")))
    if env.get("gpu"):
        out.append("- GPU: %s, compute capability %s, %s GiB; driver %s" % (
            env["gpu"], env.get("capability", "?"), fmt(env.get("gpu_memory_gib"), ".1f"),
            env.get("driver", "?")))
    out.append("- torch %s (CUDA %s), python %s; nvcc: %s" % (
        env.get("torch", "?"), env.get("torch_cuda", "-"), env.get("python", "?"),
        env.get("nvcc", "-")))
    if env.get("git"):
        out.append("- titan.cpp: %s" % env["git"])
    out += ["", "| stage | status | seconds | result |", "|---|---|---|---|"]
    total = 0.0
    for name, status, seconds, note in stages:
        out.append("| %s | %s | %s | %s |" % (name, status, seconds, note))
        try:
            total += float(seconds)
        except ValueError:
            pass
    out += ["", "Total: %.0f s (budget %s s)." % (total, env.get("budget_s", "?")), ""]

    out += measured_where(env, stages)
    parity = load(work, "parity.json")
    if parity:
        out.append("Parity (%s, float32, debug model, %d steps): max relative loss "
                   "difference %s (tolerance %g): %s." % (
                       "CPU vs CPU" if env.get("dry_run") else "GPU vs CPU", parity["steps"],
                       fmt(parity.get("max_rel"), ".2e"), parity["rtol"],
                       "pass" if parity.get("ok") else "FAIL"))
        out.append("")

    out += shared_parity_text(work, env)

    titan = load(work, "titan_bf16.json")
    eager = load(work, "ref_eager.json")
    compiled = load(work, "ref_compile.json")
    float8 = load(work, "titan_float8.json")
    shape = env.get("speed_shape")
    if titan or eager or compiled or float8:
        out += ["## Speed%s" % (": " + shape if shape else ""), "",
                "| run | tokens/s | TFLOP/s | MFU % | memory | titan bf16 / this |",
                "|---|---|---|---|---|---|"]
        base = titan.get("tokens_per_s") if titan else None
        peak = titan.get("peak_tflops") if titan else None

        def row(label, d):
            if not d:
                out.append("| %s | - | - | - | - | - |" % label)
                return
            tps = d.get("tokens_per_s")
            mfu = d.get("mfu")
            if mfu is None and peak and d.get("tflops"):
                mfu = 100.0 * d["tflops"] / peak  # titan's peak for the device
            ratio = base / tps if base and tps else None
            extra = ""
            if d.get("compile_s") is not None:
                extra = " (compile %.0f s%s)" % (d["compile_s"], "" if d.get(
                    "compile_backend", "inductor") == "inductor" else ", " + d["compile_backend"])
            out.append("| %s%s | %s | %s | %s | %s | %s |" % (
                label, extra, fmt(tps, ",.0f"), fmt_tflops(d.get("tflops")), fmt(mfu, ".1f"),
                memory_text(d), fmt(ratio, ".2f")))

        row("titan bf16", titan)
        row("PyTorch eager (bf16 autocast)", eager)
        row("PyTorch torch.compile (per block)", compiled)
        if float8 is not None:
            row("titan float8 (tensorwise)", float8)
        out.append("")
        if peak:
            out.append("MFU against %s TFLOP/s, titan's peak for this device (tokens/s x "
                       "FLOPs per token by titan's formula for every run)." % fmt_tflops(peak))
            out.append("")
    text = "\n".join(out) + "\n"
    with open(a.out, "w") as f:
        f.write(text)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("parity")
    s.add_argument("gpu")
    s.add_argument("cpu")
    s.add_argument("--steps", type=int, default=10)
    s.add_argument("--rtol", type=float, default=1e-4)
    s = sub.add_parser("speed")
    s.add_argument("metrics")
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--tokens-per-step", type=int, required=True)
    s = sub.add_parser("summary")
    s.add_argument("work")
    s.add_argument("out")
    a = p.parse_args()
    return {"parity": cmd_parity, "speed": cmd_speed, "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
