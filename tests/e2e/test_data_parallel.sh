# Data parallelism end to end, on CPU over Gloo: 10 float32 steps of the narrow debug model (seq 64,
# global batch 8, validation every 5 steps) in one process, then with FSDP 2, FSDP 4, HSDP 2x2, DDP
# 2, FSDP 2 with gradient accumulation, and reshard always / never. Every layout must give the
# single-process training and validation losses within 1e-5 relative (measured: 1.3e-7), and final
# parameters within 3e-4 absolute (measured: 2.2e-6). Gradients agree to ~1e-7 relative (summation
# order), but Adam divides by sqrt(v), so in elements whose gradient is ~0 that noise moves a step
# by a few % of lr (2e-3); a real error (a lost or doubled gradient chunk) moves parameters by ~lr
# per step and is also visible in the losses. Then: a checkpoint saved by FSDP 4 resumes under FSDP
# 2, HSDP 2x2, DDP 2 and one process with the uninterrupted run's losses; a rank killed mid-run ends
# the job non-zero within seconds; a rank with a different config is refused at start-up.

source "$(dirname "$0")/parallel_lib.sh"

# --- parity with one process ---
train single 1 --training.local_batch_size 8 --validation.local_batch_size 4
declare -A layouts=(
  [fsdp2]="2 --training.local_batch_size 4 --validation.local_batch_size 2"
  [fsdp4]="4 --training.local_batch_size 2 --validation.local_batch_size 1"
  [hsdp2x2]="4 --training.local_batch_size 2 --validation.local_batch_size 1 --parallelism.data_parallel_replicate_degree 2"
  [ddp2]="2 --training.local_batch_size 4 --validation.local_batch_size 2 --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1"
  [fsdp2_accum]="2 --training.local_batch_size 2 --validation.local_batch_size 2"
  [fsdp2_always]="2 --training.local_batch_size 4 --validation.local_batch_size 2 --parallelism.fsdp_reshard_after_forward always"
  [fsdp2_never]="2 --training.local_batch_size 4 --validation.local_batch_size 2 --parallelism.fsdp_reshard_after_forward never"
)
for name in fsdp2 fsdp4 hsdp2x2 ddp2 fsdp2_accum fsdp2_always fsdp2_never; do
  # shellcheck disable=SC2086
  train "$name" ${layouts[$name]}
  same_losses single "$name" loss
  same_losses single "$name" validation_loss
  same_params single "$name"
done
grep -q 'FSDP: sharded over 4 ranks' "$WORK/fsdp4.log" || fail "fsdp4 did not shard"
grep -q 'HSDP: sharded over 2 ranks, replicated 2x' "$WORK/hsdp2x2.log" || fail "hsdp layout"
grep -q 'DDP: replicated over 2 ranks' "$WORK/ddp2.log" || fail "ddp layout"
grep -q 'x 2 accumulation' "$WORK/fsdp2_accum.log" || fail "fsdp2_accum did not accumulate"
grep -qE 'memory per rank: parameters .* 1/(2|1\.9)' "$WORK/fsdp2.log" || fail "memory report"

# --- Hugging Face export and import under FSDP: the final export holds the weights of the same
# run's checkpoint (bit for bit),
# and a run starting from that folder has the one-process first loss.
train fsdp2_hf 2 ${layouts[fsdp2]#2 } --checkpoint.last_save_in_hf true \
  --checkpoint.last_save_model_only true
"$TITAN" convert diff "$WORK/fsdp2_hf/checkpoint/step-10-hf" "$WORK/fsdp2/checkpoint/step-10" \
  >"$WORK/out" 2>&1 || { cat "$WORK/out" >&2; fail "FSDP HF export differs from its checkpoint"; }
hf="$WORK/fsdp2_hf/checkpoint/step-10-hf"
train hf_single 1 --training.local_batch_size 8 --validation.enable false --training.steps 1 \
  --checkpoint.initial_load_path "$hf" --checkpoint.initial_load_in_hf true
train hf_fsdp2 2 --training.local_batch_size 4 --validation.enable false --training.steps 1 \
  --checkpoint.initial_load_path "$hf" --checkpoint.initial_load_in_hf true
same_losses hf_single hf_fsdp2 loss

# --- cross-layout resume: FSDP 4's step-5 checkpoint, resumed four other ways ---
for name in fsdp2 hsdp2x2 ddp2 single; do
  args=${layouts[$name]:-"1 --training.local_batch_size 8 --validation.local_batch_size 4"}
  # shellcheck disable=SC2086
  resume_from fsdp4 5 "resume_$name" $args
done

# --- faults ---
# A rank killed with SIGKILL in the middle of training: the job ends non-zero, naming the rank.
kill_rank_1_mid_run killed --training.local_batch_size 4

# A rank whose config differs: refused at the rendezvous with both digests, before training.
port=$(free_port)
pids=()
for r in 0 1; do
  extra=()
  [ $r = 1 ] && extra=(--optimizer.lr 1e-3)
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 60 "$TITAN" train "${common[@]}" --checkpoint.enable false \
    --job.dump_folder "$WORK/mismatch" "${extra[@]}" >"$WORK/mismatch.$r" 2>&1 &
  pids+=($!)
done
for r in 0 1; do
  set +e; wait "${pids[$r]}"; code=$?; set -e
  [ "$code" != 0 ] && [ "$code" != 124 ] || { cat "$WORK/mismatch.$r" >&2; fail "mismatched config: rank $r exit $code"; }
done
grep -qi 'fingerprint' "$WORK/mismatch.0" "$WORK/mismatch.1" ||
  { cat "$WORK/mismatch.0" "$WORK/mismatch.1" >&2; fail "mismatch message"; }
! grep -qE 'step: +1 ' "$WORK/mismatch.0" || fail "mismatched ranks trained"
echo "mismatched config refused"

# Ranks agree on the CPU's bf16 matmul path: where one rank's bf16 GEMMs are slow (forced here:
# rank 1 as if on an AVX2 host), every rank multiplies in float32 on the rounded operands, so that
# the ranks compute alike; the run trains. (Ranks other than 0 log warnings only.)
port=$(free_port)
pids=()
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    TITAN_CPU_FAST_BF16_MATMUL=$((1 - r)) timeout 120 "$TITAN" train "${common[@]}" \
    --training.mixed_precision_param bfloat16 --training.local_batch_size 4 --training.steps 2 \
    --validation.enable false \
    --checkpoint.enable false --job.dump_folder "$WORK/agree" >"$WORK/agree.$r" 2>&1 &
  pids+=($!)
done
for r in 0 1; do
  set +e; wait "${pids[$r]}"; code=$?; set -e
  [ "$code" = 0 ] || { cat "$WORK/agree.$r" >&2; fail "bf16 path agreement: rank $r exit $code"; }
done
grep -q 'bfloat16 matmuls and attention in float32 on the rounded operands (TITAN_CPU_FAST_BF16_MATMUL=1; another rank.s bf16 GEMMs are slow' "$WORK/agree.0" ||
  { cat "$WORK/agree.0" >&2; fail "rank 0 kept bf16 GEMMs that rank 1 measured slow"; }
echo "ranks agree on the bf16 matmul path"
