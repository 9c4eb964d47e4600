"""Reads a run's TensorBoard event files with the `tensorboard` package and checks them against
the run's metrics.jsonl: every logged step and validation has every scalar under TorchTitan's tag,
equal to the JSON value (as a float32), and nothing else is there.

usage: tensorboard_check.py METRICS_JSONL EVENT_FOLDER
Prints "<N> scalars at <M> steps match" and exits 0, or names the first difference and exits 1.
"""

import glob
import json
import math
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# TensorBoard tag -> metrics.jsonl key (src/titan/components/metrics.h, tensorboard_scalars).
TRAIN = {
    "loss_metrics/global_avg_loss": "loss",
    "grad_norm": "grad_norm",
    "lr": "lr",
    "throughput(tps)": "tps",
    "tflops": "tflops",
    "mfu(%)": "mfu",
    "time_metrics/end_to_end(s)": "time_metrics/end_to_end(s)",
}
CPU_MEMORY = {"memory/max_rss(GiB)": "memory_gib", "memory/max_rss(%)": "memory_pct"}
CUDA_MEMORY = {
    k: k
    for k in (
        "memory/max_active(GiB)",
        "memory/max_active(%)",
        "memory/max_reserved(GiB)",
        "memory/max_reserved(%)",
        "memory/num_alloc_retries",
        "memory/num_ooms",
    )
}
VALIDATION = {
    "validation_metrics/loss": "validation_loss",
    "validation_metrics/perplexity": "validation_perplexity",
}


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 3:
        fail(__doc__)
    jsonl, folder = sys.argv[1:]
    with open(jsonl) as f:
        rows = [json.loads(line) for line in f]
    # A run on a GPU logs the CUDA allocator's memory, elsewhere the process's peak RSS.
    cuda = any("memory/max_reserved(GiB)" in row for row in rows)
    train = dict(TRAIN, **(CUDA_MEMORY if cuda else CPU_MEMORY))

    files = glob.glob(os.path.join(folder, "events.out.tfevents.*"))
    if len(files) != 1:
        fail(f"{folder} holds {len(files)} event files, want 1: {files}")
    acc = EventAccumulator(folder, size_guidance={"scalars": 0})  # 0: keep every value
    acc.Reload()
    if acc.file_version != 2.0:  # parsed from the first record's "brain.Event:2"
        fail(f"{files[0]}: file_version {acc.file_version!r}, want 2.0 ('brain.Event:2')")
    got = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}

    want = {}  # tag -> {step: value}
    steps = set()
    for row in rows:
        if "event" in row:
            continue
        table = VALIDATION if "validation_loss" in row else train
        steps.add(row["step"])
        for tag, key in table.items():
            if key not in row:
                fail(f"{jsonl}: step {row['step']} lacks {key!r}")
            want.setdefault(tag, {})[row["step"]] = float(row[key])
    if not want:
        fail(f"{jsonl} holds no metrics")

    if set(got) != set(want):
        fail(f"tags differ: extra {sorted(set(got) - set(want))}, "
             f"missing {sorted(set(want) - set(got))}")
    n = 0
    for tag, values in want.items():
        if set(got[tag]) != set(values):
            fail(f"{tag}: steps {sorted(got[tag])} in TensorBoard, {sorted(values)} in {jsonl}")
        for step, value in values.items():
            if not math.isclose(got[tag][step], value, rel_tol=1e-6, abs_tol=1e-30):
                fail(f"{tag} at step {step}: TensorBoard {got[tag][step]!r}, {jsonl} {value!r}")
            n += 1
    print(f"{n} scalars at {len(steps)} steps match")


if __name__ == "__main__":
    main()
