# Qwen3 MoE end to end with the real binary: `titan inspect` prints total and active parameters;
# the tiny MoE flavor trains 30 steps (the loss falls, expert loads are logged, the expert biases
# move) with a checkpoint; `titan generate` from that checkpoint gives the same greedy ids with and
# without the KV cache; 2-process FSDP and FSDP x EP runs reproduce the single-process losses
# within 1e-5, the EP run's checkpoint generates what one process's does and its HF export holds
# the same tensors (1e-5), and says that Qwen3-MoE's HF model drops the trained routing bias; ep on
# a dense model
# exits 2 with the reason.
source "$(dirname "$0")/lib.sh"

expect_exit 0 "$TITAN" inspect --model.name qwen3 --model.flavor 30B-A3B
expect_output "30,532,122,624 total, .* 3,353,032,704 active per token"

moe=(--job.config_file configs/llama3/debug_model.toml --model.name qwen3
  --model.flavor tiny_moe --model.hf_assets_path "" --training.seq_len 64 --training.global_batch_size 8
  --training.mixed_precision_param float32 --lr_scheduler.warmup_steps 3 --optimizer.lr 3e-3
  --validation.enable false --metrics.log_freq 10 --metrics.peak_flops 1e12
  --metrics.disable_color_printing)
expect_exit 0 "$TITAN" train "${moe[@]}" --training.steps 30 --job.dump_folder "$WORK/one" \
  --training.local_batch_size 8 --checkpoint.enable --checkpoint.interval 30
cp "$WORK/out" "$WORK/one.log"
grep -q "step 30 expert load max/mean: layers.0.moe [0-9.]*, layers.1.moe [0-9.]*" \
  "$WORK/one.log" || fail "no expert load line"
first=$(grep '"loss":' "$WORK/one/metrics.jsonl" | head -n 1 | sed -E 's/.*"loss":([0-9.eE+-]+).*/\1/')
last=$(grep '"loss":' "$WORK/one/metrics.jsonl" | tail -n 1 | sed -E 's/.*"loss":([0-9.eE+-]+).*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' ||
  fail "the loss did not fall: $first -> $last"
echo "tiny_moe: loss $first -> $last"

# Generation from the MoE checkpoint (its expert biases steer the routing).
"$TITAN" generate --checkpoint "$WORK/one/checkpoint" --prompt "The" --temperature 0 \
  --max_new_tokens 20 --print_ids >"$WORK/cache.out" 2>"$WORK/gen.err" ||
  { cat "$WORK/gen.err" >&2; fail "generate failed"; }
"$TITAN" generate --checkpoint "$WORK/one/checkpoint" --prompt "The" --temperature 0 \
  --max_new_tokens 20 --print_ids --no_kv_cache >"$WORK/nocache.out" 2>"$WORK/gen.err" ||
  { cat "$WORK/gen.err" >&2; fail "generate --no_kv_cache failed"; }
cmp -s "$WORK/cache.out" "$WORK/nocache.out" || fail "greedy ids differ with and without the cache"
[ "$(wc -w <"$WORK/cache.out")" -gt 2 ] || fail "generate printed $(cat "$WORK/cache.out")"

expect_exit 0 timeout 300 "$TITAN" run --nproc_per_node 2 -- train "${moe[@]}" \
  --training.steps 10 --training.local_batch_size 4 --job.dump_folder "$WORK/fsdp"
expect_exit 0 "$TITAN" train "${moe[@]}" --training.steps 10 --training.local_batch_size 8 \
  --job.dump_folder "$WORK/ref"
same_losses() {
  paste -d' ' <(grep '"loss":' "$1" | sed -E 's/.*"loss":([0-9.eE+-]+).*/\1/') \
    <(grep '"loss":' "$2" | sed -E 's/.*"loss":([0-9.eE+-]+).*/\1/') |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d / $1 > 1e-5) bad = 1; n++ }
         END { exit bad || n == 0 }'
}
same_losses "$WORK/ref/metrics.jsonl" "$WORK/fsdp/metrics.jsonl" ||
  fail "FSDP 2 does not reproduce the single-process losses"

# Expert parallelism: tiny_moe's 4 experts, 2 per rank, tokens exchanged by all-to-all.
expect_exit 0 timeout 300 "$TITAN" run --nproc_per_node 2 -- train "${moe[@]}" \
  --training.steps 10 --training.local_batch_size 4 --job.dump_folder "$WORK/ep" \
  --parallelism.expert_parallel_degree 2 --checkpoint.enable --checkpoint.interval 10 \
  --checkpoint.last_save_in_hf true
expect_output "expert parallel over ep 2: 2 MoE layers, 2 experts per rank"
same_losses "$WORK/ref/metrics.jsonl" "$WORK/ep/metrics.jsonl" ||
  fail "EP 2 does not reproduce the single-process losses"
expect_exit 0 "$TITAN" train "${moe[@]}" --training.steps 10 --training.local_batch_size 8 \
  --job.dump_folder "$WORK/ref_ckpt" --checkpoint.enable --checkpoint.interval 10 \
  --checkpoint.last_save_in_hf true
# Qwen3-MoE's HF model has no routing bias: the export says that the trained one is dropped.
expect_output "Hugging Face export: layers.0.moe.expert_bias is not zero .*has no routing bias"
for run in ep ref_ckpt; do
  "$TITAN" generate --checkpoint "$WORK/$run/checkpoint" --prompt "The" --temperature 0 \
    --max_new_tokens 12 --print_ids >"$WORK/$run.gen" 2>"$WORK/gen.err" ||
    { cat "$WORK/gen.err" >&2; fail "generate from the $run checkpoint failed"; }
done
cmp -s "$WORK/ep.gen" "$WORK/ref_ckpt.gen" ||
  fail "the EP checkpoint generates $(cat "$WORK/ep.gen"), one process's $(cat "$WORK/ref_ckpt.gen")"
# The HF export under EP gathers every expert: the same tensors as one process's export.
if [ -n "${TITAN_PYTHON:-}" ]; then
  "$TITAN_PYTHON" - "$WORK/ep/checkpoint/step-10-hf" "$WORK/ref_ckpt/checkpoint/step-10-hf" <<'PY' ||
import sys
from safetensors.torch import load_file
a = load_file(sys.argv[1] + "/model.safetensors")
b = load_file(sys.argv[2] + "/model.safetensors")
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
worst = max((a[k] - b[k]).abs().max().item() for k in a)
print(f"EP 2 HF export vs one process: {len(a)} tensors, max difference {worst:.1e}")
assert worst < 1e-5, worst
PY
    fail "the HF export under EP differs from one process's"
fi

expect_exit 2 timeout 120 "$TITAN" run --nproc_per_node 2 -- train "${moe[@]}" \
  --training.steps 1 --training.local_batch_size 4 --parallelism.expert_parallel_degree 2 \
  --model.flavor tiny \
  --job.dump_folder "$WORK/dense"
expect_output "expert_parallel_degree = 2 needs a mixture-of-experts model"
echo "ok"
