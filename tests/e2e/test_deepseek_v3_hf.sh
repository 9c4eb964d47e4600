#!/usr/bin/env bash
# DeepSeek-V3 end to end, with transformers itself as the reference
# (tests/e2e/deepseek_v3_transformers_reference.py, run by $TITAN_PYTHON).
# (A) HF -> ours: random DeepseekV3ForCausalLM folders saved by save_pretrained (unit-scale
# weights, random non-zero e_score_correction_bias): the tiny flavor's sizes (q latent, YaRN x40,
# sigmoid routing in 4 groups of which 2), one without q latent with mscale 0.707, no group limit,
# unnormalized weights and 2 dense layers, and one without rope scaling whose values are wider
# than its query/key heads. Each converts to our checkpoint (the first to flavor "tiny"), loads
# directly too with the same logits, matches transformers' logits within 1e-4 in float32, and
# exports back to the very same tensors (expert biases included).
# (B) ours -> HF: a tiny checkpoint after 3 training steps (expert biases moved) exports as a
# folder transformers loads with every weight used, whose logits equal ours within 1e-4.
# (C) `titan generate` on the converted folders: greedy ids with and without the KV cache equal
# transformers' greedy generate (ids limited to the byte tokenizer's, as titan's are).
# (D) `titan inspect` prints 671B's total and active parameters; FSDP 2, TP 2, EP 2, PP 2 and CP 2
# (ring attention over MLA's padded heads; 2 processes) and per-op activation checkpointing
# reproduce the one-process losses of tiny within 1e-5 relative.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/hf_family_lib.sh"
PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set. HINT: run through ctest, or \
TITAN_PYTHON=\"\$(scripts/python_env.sh)\" bash $0 $TITAN"
REF="$(dirname "$0")/deepseek_v3_transformers_reference.py"
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

IDS="1 17 100 42 99 3 120 7 64 5 125 31 18 77 2 129 45 11 90 101 66 8 13 0 199"  # vocab >= 200
PROMPT="1 17 100 42"

# ---- A: folders saved by transformers -> ours -> HF --------------------------------------------
declare -A CASES=(
  [tiny]="--seed 1"
  [no_q_latent]="--seed 2 --q-lora 0 --mscale 0.707 --groups 1 --topk-groups 1 --no-route-norm
    --scale 1.0 --dense 2 --hidden 96 --heads 6 --nope 8 --rope 16 --v 24 --kv-lora 24
    --experts 6 --top-k 3"
  [no_yarn]="--seed 3 --yarn 0 --v 32"
)
hf_save_cases CASES
hf_folders_round_trip "${!CASES[@]}"
grep -q '"flavor": *"tiny"' "$WORK/ck_tiny/index.json" ||
  fail "the tiny-sized DeepSeek-V3 folder did not convert to the tiny flavor"

# ---- B: ours -> HF -----------------------------------------------------------------------------
tiny=(--job.config_file configs/llama3/debug_model.toml --model.name deepseek_v3
  --model.flavor tiny --model.hf_assets_path "" --training.seq_len 32
  --training.mixed_precision_param float32 --lr_scheduler.warmup_steps 1 --optimizer.lr 3e-3
  --validation.enable false --metrics.log_freq 1 --metrics.peak_flops 1e12
  --metrics.disable_color_printing)
expect_exit 0 "$TITAN" train "${tiny[@]}" --training.steps 3 --training.local_batch_size 4 \
  --job.dump_folder "$WORK/one" --checkpoint.enable --checkpoint.interval 3
hf_export_trained "$WORK/one/checkpoint/step-3" deepseek_v3

# ---- C: generation -----------------------------------------------------------------------------
hf_greedy 10 hf_ours hf_tiny hf_no_q_latent
hf_run_checks

# ---- D: sizes, FSDP and TP against one process -------------------------------------------------
expect_exit 0 "$TITAN" inspect --model.name deepseek_v3 --model.flavor 671B
expect_output "671,026,404,352 total, .* 37,552,282,624 active per token"
losses() { grep '"loss":' "$1" | sed -E 's/.*"loss":([0-9.eE+-]+).*/\1/'; }
same_losses() {
  paste -d' ' <(losses "$1") <(losses "$2") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d / $1 > 1e-5) bad = 1; n++ }
         END { exit bad || n != 3 }'
}
for layout in "fsdp --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2" \
  "tp --parallelism.tensor_parallel_degree 2 --training.local_batch_size 4" \
  "ep --parallelism.expert_parallel_degree 2 --training.local_batch_size 2" \
  "pp --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B
    --training.local_batch_size 4" \
  "cp --parallelism.context_parallel_degree 2 --training.local_batch_size 4"; do
  read -r -d '' name opts <<<"$layout" || true
  # shellcheck disable=SC2086  # the options split into words
  expect_exit 0 timeout 300 "$TITAN" run --nproc_per_node 2 -- train "${tiny[@]}" \
    --training.steps 3 --job.dump_folder "$WORK/$name" $opts
  same_losses "$WORK/one/metrics.jsonl" "$WORK/$name/metrics.jsonl" ||
    fail "$name 2 does not reproduce the one-process losses: $(losses "$WORK/one/metrics.jsonl" |
      tr '\n' ' ') vs $(losses "$WORK/$name/metrics.jsonl" | tr '\n' ' ')"
done
# Per-op selective activation checkpointing recomputes MLA and the MoE to the same losses.
expect_exit 0 "$TITAN" train "${tiny[@]}" --training.steps 3 --training.local_batch_size 4 \
  --job.dump_folder "$WORK/op_ac" --activation_checkpoint.mode selective \
  --activation_checkpoint.selective_ac_option op
same_losses "$WORK/one/metrics.jsonl" "$WORK/op_ac/metrics.jsonl" ||
  fail "op AC does not reproduce the losses"
echo "PASS test_deepseek_v3_hf"
