# Datasets users bring (issue 39 item 1): TorchTitan's c4 names over a c4-format fixture (gzip
# shards in en/), .jsonl.gz and .jsonl.zst (made by the gzip and zstd commands), parquet written
# by pyarrow from the project's environment (several row groups; a hub-style data/ folder with
# train and test splits). Each trains a few steps; a resumed run gives the uninterrupted run's
# losses bit for bit on a compressed and on a parquet source (spans shuffled across epochs);
# corrupt files stop the run naming the file and the offset; and the debug_model config trains
# with TorchTitan's dataset names (c4_test, c4_validation) given only the fixture paths.
source "$(dirname "$0")/lib.sh"

PY="${TITAN_PYTHON:-}"
if [ -z "$PY" ]; then PY="$(bash scripts/python_env.sh --print)"; fi
"$PY" -c "import pyarrow" || fail "the project's Python ($PY) lacks pyarrow; run scripts/setup.sh"
command -v zstd >/dev/null || fail "the zstd command is missing; run scripts/setup.sh"

data="$WORK/data"
"$PY" - "$data" <<'EOF'
import gzip, json, os, random, sys
import pyarrow as pa, pyarrow.parquet as pq

root = sys.argv[1]
rng = random.Random(0)
words = "the quick brown fox jumps over a lazy dog while data loaders stream shards".split()
def doc(i):
    return " ".join(rng.choice(words) for _ in range(rng.randint(8, 60))) + f" ({i})"
rows = [{"text": doc(i), "timestamp": "2019-04-25T12:00:00Z", "url": f"https://example.org/{i}"}
        for i in range(600)]

def write_jsonl(path, part, opener=open, mode="w"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with opener(path, mode) as f:
        for r in part:
            f.write((json.dumps(r) + "\n").encode() if "b" in mode else json.dumps(r) + "\n")

# c4 layout: en/c4-train.NNNNN-of-NNNNN.json.gz and en/c4-validation.*.json.gz.
write_jsonl(f"{root}/c4/en/c4-train.00000-of-00002.json.gz", rows[:250], gzip.open, "wb")
write_jsonl(f"{root}/c4/en/c4-train.00001-of-00002.json.gz", rows[250:500], gzip.open, "wb")
write_jsonl(f"{root}/c4/en/c4-validation.00000-of-00001.json.gz", rows[500:], gzip.open, "wb")
# TorchTitan's c4_test folder: data.json, JSON lines.
write_jsonl(f"{root}/c4_test/data.json", rows[:300])
write_jsonl(f"{root}/plain.jsonl", rows)  # compressed below by the gzip and zstd commands

table = pa.table({"id": list(range(len(rows))), "text": [r["text"] for r in rows],
                  "messages": [[{"role": "user", "content": r["text"][:20]}] for r in rows]})
pq.write_table(table, f"{root}/groups.parquet", row_group_size=64)
os.makedirs(f"{root}/hub/data", exist_ok=True)
pq.write_table(table.slice(0, 300), f"{root}/hub/data/train-00000-of-00002.parquet", row_group_size=50)
pq.write_table(table.slice(300, 200), f"{root}/hub/data/train-00001-of-00002.parquet", row_group_size=50)
pq.write_table(table.slice(500), f"{root}/hub/data/test-00000-of-00001.parquet")
EOF
gzip -c "$data/plain.jsonl" >"$data/docs.jsonl.gz"
zstd -q -c "$data/plain.jsonl" >"$data/docs.jsonl.zst"

base=(train --job.config_file configs/llama3/debug_model.toml --model.flavor tiny
      --model.hf_assets_path "" --training.seq_len 32 --training.local_batch_size 2
      --metrics.log_freq 1 --metrics.peak_flops 1e12 --metrics.disable_color_printing)
noval=(--validation.enable false)

# Each format trains.
expect_exit 0 "$TITAN" "${base[@]}" "${noval[@]}" --training.steps 3 --job.dump_folder "$WORK/c4" \
  --training.dataset c4 --training.dataset_path "$data/c4"
expect_output "dataset c4: 500 documents"
expect_output "step: 3 .*loss: "
expect_exit 0 "$TITAN" "${base[@]}" "${noval[@]}" --training.steps 2 --job.dump_folder "$WORK/gz" \
  --training.dataset jsonl --training.dataset_path "$data/docs.jsonl.gz"
expect_output "dataset jsonl: 600 documents"
expect_exit 0 "$TITAN" "${base[@]}" "${noval[@]}" --training.steps 2 --job.dump_folder "$WORK/zst" \
  --training.dataset auto --training.dataset_path "$data/docs.jsonl.zst"
expect_output "dataset auto: 600 documents"
expect_exit 0 "$TITAN" "${base[@]}" --training.steps 2 --job.dump_folder "$WORK/hub" \
  --training.dataset parquet --training.dataset_path "$data/hub" \
  --validation.enable true --validation.freq 2 --validation.steps 2 --validation.seq_len 32 \
  --validation.local_batch_size 2 --validation.dataset parquet --validation.dataset_path "$data/hub"
expect_output "dataset parquet: 500 documents"
expect_output "no 'validation' split; reading 'test'"

# Resume: a run resumed from the uninterrupted run's step-3 checkpoint logs that run's losses for
# steps 4-6, bit for bit.
losses() { sed -nE 's/.*"loss":([^,}]+).*"step":([0-9]+).*/\2 \1/p; s/.*"step":([0-9]+).*"loss":([^,}]+).*/\1 \2/p' "$1" | sort -u; }
check_resume() {  # NAME ARGS...
  local name="$1"; shift
  local ckpt=(--checkpoint.enable --checkpoint.interval 3 --checkpoint.last_save_model_only false)
  expect_exit 0 "$TITAN" "${base[@]}" "${noval[@]}" "$@" --training.steps 6 "${ckpt[@]}" \
    --job.dump_folder "$WORK/ref_$name"
  mkdir -p "$WORK/res_$name/checkpoint"
  cp -r "$WORK/ref_$name/checkpoint/step-3" "$WORK/res_$name/checkpoint/"
  expect_exit 0 "$TITAN" "${base[@]}" "${noval[@]}" "$@" --training.steps 6 "${ckpt[@]}" \
    --job.dump_folder "$WORK/res_$name"
  expect_output "resuming training after step 3"
  diff <(losses "$WORK/ref_$name/metrics.jsonl" | tail -n 3) \
    <(losses "$WORK/res_$name/metrics.jsonl") ||
    fail "$name: resumed losses differ from the uninterrupted run"
  [ "$(losses "$WORK/ref_$name/metrics.jsonl" | wc -l)" = 6 ] || fail "$name: expected 6 steps"
}
# Small sources so that 6 steps of 2 x 257 byte tokens cross an epoch: gzip (one span: a span is
# ~1 MiB of text) and parquet in row groups of 3 (4 spans, shuffled span by span).
head -n 6 "$data/plain.jsonl" | gzip -c >"$data/small.jsonl.gz"
check_resume gz --training.dataset jsonl --training.dataset_path "$data/small.jsonl.gz" \
  --training.seq_len 256
"$PY" -c "
import pyarrow.parquet as pq, sys
t = pq.read_table(sys.argv[1]).slice(0, 12)
pq.write_table(t, sys.argv[2], row_group_size=3)" "$data/groups.parquet" "$data/small.parquet"
check_resume parquet --training.dataset parquet --training.dataset_path "$data/small.parquet" \
  --training.seq_len 256
expect_output "re-looped"  # the resumed run crossed an epoch

# Corrupt files: the file and the offset, exit code 1, no hang.
head -c 3000 "$data/docs.jsonl.gz" >"$data/cut.jsonl.gz"
expect_exit 1 timeout 60 "$TITAN" "${base[@]}" "${noval[@]}" --training.steps 1 \
  --job.dump_folder "$WORK/bad" --training.dataset jsonl --training.dataset_path "$data/cut.jsonl.gz"
expect_output "cut.jsonl.gz: truncated: the file ends inside a gzip member at compressed byte offset 3000"
head -c 2000 "$data/docs.jsonl.zst" >"$data/cut.jsonl.zst"
expect_exit 1 timeout 60 "$TITAN" "${base[@]}" "${noval[@]}" --training.steps 1 \
  --job.dump_folder "$WORK/bad" --training.dataset jsonl --training.dataset_path "$data/cut.jsonl.zst"
expect_output "cut.jsonl.zst: truncated: the file ends inside a zstd frame at compressed byte offset"
head -c 5000 "$data/groups.parquet" >"$data/cut.parquet"
expect_exit 1 timeout 60 "$TITAN" "${base[@]}" "${noval[@]}" --training.steps 1 \
  --job.dump_folder "$WORK/bad" --training.dataset parquet --training.dataset_path "$data/cut.parquet"
expect_output "cut.parquet: cannot open: .*magic bytes"
expect_exit 1 "$TITAN" "${base[@]}" "${noval[@]}" --training.steps 1 --job.dump_folder "$WORK/bad" \
  --training.dataset parquet --training.dataset_path "$data/groups.parquet" \
  --training.dataset_text_field txt
expect_output "no column \"txt\"; the columns are id, text, messages.*did you mean"
# c4 without files: where to put them and which key to set.
expect_exit 1 "$TITAN" "${base[@]}" "${noval[@]}" --training.steps 1 --job.dump_folder "$WORK/bad" \
  --training.dataset c4 --training.dataset_path "$data/c4_test"
expect_output "no en/c4-train.NNNNN-of-NNNNN.json.gz files under .*training.dataset_path"

# The debug_model config with TorchTitan's dataset names, given only the fixture paths.
expect_exit 0 "$TITAN" train --job.config_file configs/llama3/debug_model.toml --training.steps 3 \
  --job.dump_folder "$WORK/tt" --metrics.log_freq 1 --metrics.disable_color_printing \
  --training.dataset c4_test --training.dataset_path "$data/c4_test" \
  --validation.dataset c4_validation --validation.dataset_path "$data/c4" \
  --validation.freq 3 --validation.steps 2
expect_output "dataset c4_test: 300 documents"
expect_output "step: 3 .*loss: "
expect_output "validation"
echo "ok"
