#!/usr/bin/env bash
# DeepSeek-V3's multi-token prediction end to end: deepseek_v3 tiny_mtp (tiny with 2 prediction
# depths), block-causal documents, with transformers' MtpModel as the reference
# (deepseek_v3_transformers_reference.py check-mtp, run by $TITAN_PYTHON).
# (A) 6 steps log loss and mtp_loss every step (console and metrics.jsonl), and both fall;
#     resuming from the step-3 checkpoint reproduces steps 4-6, mtp_loss included.
# (B) training.mtp_loss_weight 0: the main losses are tiny's (the depths leave the main model as
#     it is); weight 1 changes them.
# (C) FSDP 2, DDP 2, EP 2 and full activation checkpointing reproduce the one-process loss and
#     mtp_loss within 1e-5 relative; pipeline, tensor and context parallelism are refused, naming
#     multi-token prediction.
# (D) Hugging Face: the step-3 checkpoint exports with num_nextn_predict_layers 2 (layers 3 and 4);
#     transformers loads the main model with every weight used and MtpModel loads the depths from
#     the folder; the main and both depths' logits equal ours within 1e-4. The folder converts back
#     to tiny_mtp with identical tensors, and trains into flavor tiny (the depths left unread, with
#     a warning). `titan generate` runs the main model (same ids with and without the KV cache).
# (E) `titan inspect` counts the depth of debugmodel_mtp.
source "$(dirname "$0")/lib.sh"
PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh)\" bash $0 $TITAN"
REF="$(dirname "$0")/deepseek_v3_transformers_reference.py"
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

run=(--job.config_file configs/llama3/debug_model.toml --model.name deepseek_v3
  --model.flavor tiny_mtp --model.hf_assets_path "" --model.attn_mask_type block_causal
  --training.seq_len 32 --training.mixed_precision_param float32 --training.steps 6
  --lr_scheduler.warmup_steps 1 --optimizer.lr 3e-3 --validation.enable false
  --metrics.log_freq 1 --metrics.peak_flops 1e12 --metrics.disable_color_printing)
values() { grep "\"$2\":" "$WORK/$1/metrics.jsonl" | sed -E "s/.*\"$2\":(-?[0-9.eE+-]+).*/\1/"; }
# close NAME REF KEY TOL: whether NAME's KEY values equal REF's within TOL relative (same count,
# > 0); same: that, or fail.
close() {
  paste -d' ' <(values "$2" "$3") <(values "$1" "$3") |
    awk -v tol="$4" '{ d = $1 - $2; if (d < 0) d = -d; if (d / $1 > tol || NF != 2) bad = 1; n++ }
                     END { exit bad || n == 0 }'
}
same() {
  close "$@" ||
    fail "$1: $3 $(values "$1" "$3" | tr '\n' ' ') vs $2's $(values "$2" "$3" | tr '\n' ' ')"
}

# ---- A: training, resume ------------------------------------------------------------------------
expect_exit 0 "$TITAN" train "${run[@]}" --training.local_batch_size 4 --job.dump_folder "$WORK/one" \
  --checkpoint.enable --checkpoint.interval 3 --checkpoint.last_save_model_only false
expect_output "2 multi-token prediction layers"
expect_output "step: 6  loss: +[0-9.]+  mtp_loss: +[0-9.]+  grad_norm"
[ "$(values one mtp_loss | wc -l)" = 6 ] || fail "mtp_loss is not in every metrics row"
for key in loss mtp_loss; do
  first=$(values one "$key" | head -n 1) last=$(values one "$key" | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.2) }' ||
    fail "$key does not fall over 6 steps: $first -> $last"
done
mkdir -p "$WORK/resume/checkpoint"
cp -r "$WORK/one/checkpoint/step-3" "$WORK/resume/checkpoint/"
expect_exit 0 "$TITAN" train "${run[@]}" --training.local_batch_size 4 \
  --job.dump_folder "$WORK/resume" --checkpoint.enable --checkpoint.interval 3
expect_output "resuming training after step 3"
mkdir -p "$WORK/one_after_3"
tail -n 3 "$WORK/one/metrics.jsonl" >"$WORK/one_after_3/metrics.jsonl"
same resume one_after_3 loss 1e-6
same resume one_after_3 mtp_loss 1e-6

# ---- B: the weight ------------------------------------------------------------------------------
expect_exit 0 "$TITAN" train "${run[@]}" --training.local_batch_size 4 \
  --job.dump_folder "$WORK/plain" --model.flavor tiny
expect_exit 0 "$TITAN" train "${run[@]}" --training.local_batch_size 4 \
  --job.dump_folder "$WORK/weight0" --training.mtp_loss_weight 0
same weight0 plain loss 1e-6
expect_exit 0 "$TITAN" train "${run[@]}" --training.local_batch_size 4 \
  --job.dump_folder "$WORK/weight1" --training.mtp_loss_weight 1
! close weight1 one loss 1e-4 || fail "training.mtp_loss_weight 1 trains as 0.1 does"
expect_exit 2 "$TITAN" train "${run[@]}" --job.dump_folder "$WORK/bad" --training.mtp_loss_weight -1
expect_output "training.mtp_loss_weight must be >= 0"

# ---- C: parallelisms ----------------------------------------------------------------------------
for layout in "fsdp --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2" \
  "ddp --parallelism.data_parallel_replicate_degree 2 --training.local_batch_size 2" \
  "ep --parallelism.expert_parallel_degree 2 --training.local_batch_size 2"; do
  read -r -d '' name opts <<<"$layout" || true
  # shellcheck disable=SC2086  # the options split into words
  expect_exit 0 timeout 300 "$TITAN" run --nproc_per_node 2 -- train "${run[@]}" \
    --job.dump_folder "$WORK/$name" $opts
  same "$name" one loss 1e-5
  same "$name" one mtp_loss 1e-5
done
expect_exit 0 "$TITAN" train "${run[@]}" --training.local_batch_size 4 \
  --job.dump_folder "$WORK/ac" --activation_checkpoint.mode full
same ac one loss 1e-5
same ac one mtp_loss 1e-5
for refused in "pipeline --parallelism.pipeline_parallel_degree 2
    --parallelism.pipeline_parallel_schedule 1F1B" "tensor --parallelism.tensor_parallel_degree 2" \
  "context --parallelism.context_parallel_degree 2"; do
  read -r -d '' name opts <<<"$refused" || true
  # shellcheck disable=SC2086
  expect_exit 2 timeout 120 "$TITAN" run --nproc_per_node 2 -- train "${run[@]}" \
    --training.local_batch_size 4 --job.dump_folder "$WORK/$name" $opts
  expect_output "multi-token prediction \(num_mtp_layers = 2\) does not compose with $name parallelism"
done

# ---- D: Hugging Face ----------------------------------------------------------------------------
IDS="1 17 100 42 99 3 120 7 64 5 125 31 18 77 2 129 45 11 90 101 66 8 13 0 199"
ck="$WORK/one/checkpoint/step-3"
expect_exit 0 "$TITAN" convert logits "$ck" --ids "$IDS" --out "$WORK/logits.st"
expect_exit 0 "$TITAN" convert to-hf "$ck" "$WORK/hf"
grep -q '"num_nextn_predict_layers": 2' "$WORK/hf/config.json" || fail "num_nextn_predict_layers"
expect_exit 0 "$PY" "$REF" check-mtp "$WORK/hf" "$WORK/logits.st" --ids "$IDS"
cat "$WORK/out"
expect_exit 0 "$TITAN" convert from-hf "$WORK/hf" "$WORK/back"
grep -q '"flavor": *"tiny_mtp"' "$WORK/back/index.json" || fail "the folder is not tiny_mtp"
expect_exit 0 "$TITAN" convert diff "$ck" "$WORK/back"
expect_output "identical"
expect_exit 0 "$TITAN" train "${run[@]}" --model.flavor tiny --training.local_batch_size 4 \
  --training.steps 1 --job.dump_folder "$WORK/from_hf" --checkpoint.initial_load_path "$WORK/hf" \
  --checkpoint.initial_load_in_hf true --checkpoint.enable
expect_output "multi-token prediction layers from model.layers.3 on are not read"
for cache in "" --no_kv_cache; do
  # shellcheck disable=SC2086  # one option or none
  expect_exit 0 "$TITAN" generate --checkpoint "$ck" --prompt_ids "1 17 100 42" --temperature 0 \
    --max_new_tokens 8 --print_ids $cache
  grep -E "^[0-9 ]+$" "$WORK/out" >"$WORK/gen$cache"
done
cmp -s "$WORK/gen" "$WORK/gen--no_kv_cache" || fail "greedy ids differ with and without the cache"

# ---- E: sizes -----------------------------------------------------------------------------------
expect_exit 0 "$TITAN" inspect --model.name deepseek_v3 --model.flavor debugmodel_mtp
expect_output "1 multi-token prediction layer"
echo "PASS test_mtp"
