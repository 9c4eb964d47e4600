#!/usr/bin/env bash
# `titan plot` end to end: two tiny training runs, A with validation and a real resume (its last
# checkpoint removed, so the second start drops the rows past step 4 and logs steps 5-8 again),
# B without validation and with metrics.save_for_all_ranks (metrics_rank_0.jsonl). Both are
# plotted into one SVG, which Python's XML parser reads back: the panels present, a legend naming
# both runs, and each run's loss and validation-loss polylines with one point per logged step
# whose position, mapped back through the panel's axes, gives that step's value (1e-4 of the
# axis). The same on a log scale, and a copy of A's file with the dropped rows put back before
# the resume marker plots exactly as A (no step twice). Errors exit 2: no run, a missing folder, a
# folder without metrics, an unknown metric (the nearest named), a corrupt line (file:line), a
# PNG output.
source "$(dirname "$0")/lib.sh"
PY="${TITAN_PYTHON:-python3}"

tiny=(--job.config_file configs/llama3/debug_model.toml --model.flavor tiny
  --model.hf_assets_path "" --training.seq_len 32 --training.local_batch_size 2
  --training.mixed_precision_param float32 --training.steps 8 --lr_scheduler.warmup_steps 2
  --metrics.log_freq 1 --metrics.peak_flops 1e12 --metrics.disable_color_printing
  --validation.seq_len 32 --validation.local_batch_size 2 --validation.steps 2
  --validation.freq 4)

expect_exit 0 "$TITAN" train "${tiny[@]}" --job.dump_folder "$WORK/A" --checkpoint.enable \
  --checkpoint.interval 4
rm -rf "$WORK/A/checkpoint/step-8"  # as if killed after logging step 8, before saving it
expect_exit 0 "$TITAN" train "${tiny[@]}" --job.dump_folder "$WORK/A" --checkpoint.enable \
  --checkpoint.interval 4
grep -q '"event":"resume"' "$WORK/A/metrics.jsonl" || fail "A did not resume"
grep -q '"dropped_rows":5' "$WORK/A/metrics.jsonl" || fail "A's resume dropped no rows"
expect_exit 0 "$TITAN" train "${tiny[@]}" --job.dump_folder "$WORK/B" --training.steps 6 \
  --optimizer.lr 1e-3 --validation.enable false --metrics.save_for_all_ranks
[ -f "$WORK/B/metrics_rank_0.jsonl" ] || fail "B wrote no metrics_rank_0.jsonl"

# check.py SVG SCALE RUN_LABEL=FILE ...: the checks above on one SVG.
cat >"$WORK/check.py" <<'EOF'
import json, math, sys
import xml.etree.ElementTree as ET

svg_path, scale, runs = sys.argv[1], sys.argv[2], [a.split("=", 1) for a in sys.argv[3:]]
NS = "{http://www.w3.org/2000/svg}"
root = ET.parse(svg_path).getroot()  # raises on malformed XML
assert root.tag == NS + "svg", root.tag
legend = ["".join(e.itertext()) for e in root.iter(NS + "g") if e.get("class") == "legend-entry"]
assert legend == [label for label, _ in runs], legend
panels = {g.get("data-metric"): g for g in root.iter(NS + "g") if g.get("class") == "panel"}

def rows(path):
    out = {}
    for line in open(path):
        row = json.loads(line)
        for key, value in row.items():
            if key not in ("step", "event") and "event" not in row and isinstance(value, float):
                out.setdefault(key, []).append((row["step"], value))
    return out

checked = 0
for label, path in runs:
    data = rows(path)
    for metric in ("loss", "validation_loss"):
        if metric not in panels:
            continue
        panel = panels[metric]
        assert panel.get("data-scale") == (scale if "loss" in metric else "linear")
        x0, x1 = map(float, panel.get("data-x-domain").split())
        y0, y1 = map(float, panel.get("data-y-domain").split())
        log = panel.get("data-scale") == "log"
        if log:
            y0, y1 = math.log10(y0), math.log10(y1)
        area = next(r for r in panel.iter(NS + "rect") if r.get("class") == "plot-area")
        ax, ay, aw, ah = (float(area.get(k)) for k in ("x", "y", "width", "height"))
        lines = [p for p in panel.iter(NS + "polyline") if p.get("data-label") == label]
        want = data.get(metric, [])
        if not want:
            assert not lines, f"{label} has no {metric} but a line"
            continue
        assert len(lines) == 1, f"{label} {metric}: {len(lines)} polylines"
        points = [tuple(map(float, xy.split(","))) for xy in lines[0].get("points").split()]
        steps = [s for s, _ in want]
        assert len(set(steps)) == len(steps), f"{path}: a step twice in {metric}"
        assert len(points) == len(want), f"{label} {metric}: {len(points)} points, {len(want)} steps"
        for (px, py), (step, value) in zip(points, want):
            got_step = x0 + (px - ax) / aw * (x1 - x0)
            got = y0 + (ay + ah - py) / ah * (y1 - y0)
            ref = math.log10(value) if log else value
            assert abs(got_step - step) < 1e-3, (label, metric, got_step, step)
            assert abs(got - ref) <= 1e-4 * (y1 - y0), (label, metric, step, got, ref)
            checked += 1
print(f"{svg_path}: {len(panels)} panels, {checked} points checked")
EOF

expect_exit 0 "$TITAN" plot "$WORK/A" "$WORK/B/" --out "$WORK/ab.svg" --labels A,B
expect_output "wrote .*ab.svg: 2 lines, panels loss, validation_loss, lr, tps, memory_gib"
"$PY" "$WORK/check.py" "$WORK/ab.svg" linear "A=$WORK/A/metrics.jsonl" \
  "B rank 0=$WORK/B/metrics_rank_0.jsonl" || fail "ab.svg"
grep -q '<polyline class="series" data-series="1" data-label="B rank 0"' "$WORK/ab.svg" ||
  fail "no line of B in the loss panel"
[ "$(grep -c 'data-label="B rank 0"' "$WORK/ab.svg")" = 4 ] ||  # loss, lr, tps, memory; no val
  fail "B should have 4 lines"

expect_exit 0 "$TITAN" plot "$WORK/A/metrics.jsonl" "$WORK/B" --metrics loss,validation_loss \
  --log-loss --out "$WORK/log.svg" --title "A vs B"
"$PY" "$WORK/check.py" "$WORK/log.svg" log "$WORK/A/metrics.jsonl=$WORK/A/metrics.jsonl" \
  "$WORK/B rank 0=$WORK/B/metrics_rank_0.jsonl" || fail "log.svg"

# A's interrupted rows put back before its resume marker: still one point a step, A's values.
"$PY" - "$WORK/A/metrics.jsonl" "$WORK/C.jsonl" <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
marker = next(i for i, l in enumerate(lines) if '"event"' in l)
stale = []
for l in lines[marker + 1:]:
    row = json.loads(l)
    for k in ("loss", "validation_loss"):
        if k in row:
            row[k] += 1.0
    stale.append(json.dumps(row))
open(sys.argv[2], "w").write("\n".join(lines[:marker] + stale + lines[marker:]) + "\n")
EOF
expect_exit 0 "$TITAN" plot "$WORK/C.jsonl" --out "$WORK/c.svg" --labels A
"$PY" "$WORK/check.py" "$WORK/c.svg" linear "A=$WORK/A/metrics.jsonl" || fail "c.svg"

# Errors.
expect_exit 2 "$TITAN" plot
expect_output "no run to plot"
# The flag table: an unknown flag names the nearest one; --help lists every flag; bench's
# --help lists its own flag before the config keys.
expect_exit 2 "$TITAN" plot "$WORK/A" --outt "$WORK/x.svg"
expect_output "unknown argument '--outt'; did you mean '--out'?"
expect_exit 0 "$TITAN" plot --help
expect_output "--log-loss *log scale"
expect_exit 0 "$TITAN" bench --help
expect_output "--breakdown *then as many steps again"
expect_output "--training.steps"
expect_exit 2 "$TITAN" plot "$WORK/nope" --out "$WORK/x.svg"
expect_output "run '.*nope' does not exist"
mkdir "$WORK/empty"
expect_exit 2 "$TITAN" plot "$WORK/empty" --out "$WORK/x.svg"
expect_output "no metrics in '.*empty': it holds neither metrics.jsonl nor metrics_rank_<r>.jsonl"
expect_exit 2 "$TITAN" plot "$WORK/A" --metrics loss,valdation_loss --out "$WORK/x.svg"
expect_output "unknown metric 'valdation_loss'; did you mean 'validation_loss'\?"
mkdir "$WORK/bad"
{ head -n 2 "$WORK/A/metrics.jsonl"; echo '{"step": 3, "loss": 4.'; tail -n 1 "$WORK/A/metrics.jsonl"; } \
  >"$WORK/bad/metrics.jsonl"
expect_exit 2 "$TITAN" plot "$WORK/bad" --out "$WORK/x.svg"
expect_output "bad/metrics.jsonl:3: not a JSON object"
expect_exit 2 "$TITAN" plot "$WORK/A" --out "$WORK/x.png"
expect_output "titan plot writes SVG"
[ ! -e "$WORK/x.svg" ] || fail "a failed plot wrote its output"
echo "plot: OK"
