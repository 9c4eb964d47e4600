# Shared by the Hugging Face tests of the decoder families (test_deepseek_v3_hf.sh,
# test_gpt_oss_hf.sh, test_llama4_hf.sh), sourced after lib.sh or parallel_lib.sh: each queues its
# transformers checks on the array `checks` (commands of the family's *_transformers_reference.py,
# each ending in "+") and runs them in one Python process at the end (hf_run_checks), since
# importing transformers takes seconds. Expects $PY, $REF, $IDS and $PROMPT.
checks=()

# hf_save_cases CASES: the reference's save-random writes $WORK/hf_CASE for each key of the
# associative array named CASES, with its value as the options.
hf_save_cases() {
  local -n cases="$1"
  local save=() c
  for c in "${!cases[@]}"; do
    # shellcheck disable=SC2206  # the options split into words
    save+=(save-random "$WORK/hf_$c" ${cases[$c]} +)
  done
  unset 'save[${#save[@]}-1]'  # the trailing "+"
  "$PY" "$REF" "${save[@]}" || fail "transformers could not write the random folders"
}

# hf_folders_round_trip CASE...: each folder $WORK/hf_CASE (saved by transformers) converts to
# our checkpoint $WORK/ck_CASE whose logits over $IDS equal those of the folder read directly,
# and exports back to $WORK/back_CASE; queues transformers' logits and the same tensors.
hf_folders_round_trip() {
  local c hf
  for c in "$@"; do
    hf="$WORK/hf_$c"
    expect_exit 0 "$TITAN" convert from-hf "$hf" "$WORK/ck_$c"
    expect_exit 0 "$TITAN" convert logits "$WORK/ck_$c" --ids "$IDS" --out "$WORK/logits_$c.st"
    expect_exit 0 "$TITAN" convert logits "$hf" --ids "$IDS" --out "$WORK/logits_${c}_hf.st"
    cmp "$WORK/logits_$c.st" "$WORK/logits_${c}_hf.st" ||
      fail "$c: logits from the HF folder and from its conversion differ"
    expect_exit 0 "$TITAN" convert to-hf "$WORK/ck_$c" "$WORK/back_$c"
    checks+=(check-logits "$hf" "$WORK/logits_$c.st" --ids "$IDS" + same-tensors "$hf" "$WORK/back_$c" +)
  done
}

# hf_export_trained CHECKPOINT MODEL_TYPE: exports our checkpoint to $WORK/hf_ours, whose
# config.json names MODEL_TYPE; queues transformers' logits against ours.
hf_export_trained() {
  expect_exit 0 "$TITAN" convert logits "$1" --ids "$IDS" --out "$WORK/logits_ours.st"
  expect_exit 0 "$TITAN" convert to-hf "$1" "$WORK/hf_ours"
  grep -q "\"model_type\": \"$2\"" "$WORK/hf_ours/config.json" || fail "model_type not $2"
  checks+=(check-logits "$WORK/hf_ours" "$WORK/logits_ours.st" --ids "$IDS" +)
}

# hf_greedy NEW FOLDER...: `titan generate` of NEW tokens after $PROMPT from each $WORK/FOLDER
# gives the same greedy ids with and without the KV cache; queues transformers' greedy ids.
hf_greedy() {
  local new="$1" m cache; shift
  for m in "$@"; do
    for cache in "" --no_kv_cache; do
      # shellcheck disable=SC2086  # $cache is one option or none
      "$TITAN" generate --checkpoint "$WORK/$m" --prompt_ids "$PROMPT" --temperature 0 \
        --max_new_tokens "$new" --print_ids $cache >"$WORK/gen_$m$cache.out" 2>"$WORK/gen.err" ||
        { cat "$WORK/gen.err" >&2; fail "generate $m $cache failed"; }
    done
    cmp -s "$WORK/gen_$m.out" "$WORK/gen_$m--no_kv_cache.out" ||
      fail "$m: greedy ids differ with and without the KV cache"
    checks+=(check-greedy "$WORK/$m" --ids "$PROMPT" --expect "$(cat "$WORK/gen_$m.out")" --new "$new" +)
  done
}

# hf_lora CONFIG TARGETS [PATTERN]: LoRA (rank 4) on TARGETS of the tiny flavor, from the folder
# $WORK/hf_tiny, 6 steps on a token file; the training output matches PATTERN if given. Its PEFT
# export is queued against peft's logits on the folder, the merged export against transformers',
# and the folder plus the adapter must import to the trained model's very logits.
hf_lora() {
  "$PY" "$REF" token-file "$WORK/tokens.bin" --vocab-size 258 --tokens 130 >/dev/null ||
    fail "could not write the token file"
  expect_exit 0 "$TITAN" train --job.config_file "$1" --model.flavor tiny \
    --model.hf_assets_path "" --checkpoint.initial_load_path "$WORK/hf_tiny" \
    --checkpoint.initial_load_in_hf true --training.dataset tokens \
    --training.dataset_path "$WORK/tokens.bin" --training.dataset_shuffle false \
    --training.seq_len 32 --training.local_batch_size 4 --training.steps 6 \
    --training.mixed_precision_param float32 --metrics.log_freq 1 --lr_scheduler.warmup_steps 2 \
    --optimizer.lr 1e-2 --validation.enable false --checkpoint.enable true \
    --checkpoint.interval 6 --checkpoint.last_save_model_only true --model.converters lora \
    --lora.rank 4 --lora.alpha 8 --lora.target_modules "$2" --job.dump_folder "$WORK/lora"
  [ -z "${3:-}" ] || expect_output "$3"
  local lck="$WORK/lora/checkpoint/step-6"
  expect_exit 0 "$TITAN" convert logits "$lck" --ids "$IDS" --out "$WORK/logits_lora.st"
  expect_exit 0 "$TITAN" convert to-peft "$lck" "$WORK/peft"
  expect_exit 0 "$TITAN" convert to-hf "$lck" "$WORK/merged" --merge-lora
  checks+=(check-peft "$WORK/hf_tiny" "$WORK/peft" "$WORK/logits_lora.st" --ids "$IDS" +
    check-logits "$WORK/merged" "$WORK/logits_lora.st" --ids "$IDS" +)
  expect_exit 0 "$TITAN" convert from-hf "$WORK/hf_tiny" "$WORK/imported" --adapter "$WORK/peft"
  expect_exit 0 "$TITAN" convert logits "$WORK/imported" --ids "$IDS" --out "$WORK/logits_imp.st"
  cmp "$WORK/logits_lora.st" "$WORK/logits_imp.st" ||
    fail "the imported PEFT adapter does not give the trained model's logits"
}

# hf_run_checks: the queued transformers checks, in one process.
hf_run_checks() {
  unset 'checks[${#checks[@]}-1]'  # the trailing "+"
  "$PY" "$REF" "${checks[@]}" || fail "transformers disagrees (see the FAIL lines above)"
}

# hf_tiny_layouts CONFIG: the tiny flavor of CONFIG trains 6 float32 steps of seq 32 (into
# $WORK/one, checkpoints at 3 and 6) with a falling loss; FSDP 2, TP 2, EP 2, experts split over
# TP 2, PP 2, CP 2 and per-op activation checkpointing reproduce its losses within 1e-5 relative,
# and a run resumed from step 3 repeats them (parallel_lib.sh's train and same_losses).
hf_tiny_layouts() {
  common=(--job.config_file "$1" --model.flavor tiny
    --model.hf_assets_path "" --training.seq_len 32 --training.local_batch_size 4
    --training.global_batch_size 4 --training.steps 6 --training.mixed_precision_param float32
    --metrics.log_freq 1 --metrics.peak_flops 1e12 --metrics.disable_color_printing
    --lr_scheduler.warmup_steps 2 --optimizer.lr 1e-2 --validation.enable false
    --checkpoint.enable true --checkpoint.interval 3 --checkpoint.last_save_model_only false)
  train one 1
  local first last
  first=$(json_field "$WORK/one/metrics.jsonl" loss 1)
  last=$(json_field "$WORK/one/metrics.jsonl" loss 6)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1) }' ||
    fail "loss did not fall: $first -> $last"
  echo "one: loss $first -> $last over 6 steps"
  train fsdp2 2 --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2
  same_losses one fsdp2 loss
  train tp2 2 --parallelism.tensor_parallel_degree 2
  same_losses one tp2 loss
  train ep2 2 --parallelism.expert_parallel_degree 2 --training.local_batch_size 2
  same_losses one ep2 loss
  train etp2 2 --parallelism.tensor_parallel_degree 2 --parallelism.expert_tensor_parallel_degree 2
  same_losses one etp2 loss
  train pp2 2 --parallelism.pipeline_parallel_degree 2 \
    --parallelism.pipeline_parallel_schedule 1F1B --parallelism.pipeline_parallel_microbatch_size 2
  same_losses one pp2 loss
  train cp2 2 --parallelism.context_parallel_degree 2
  same_losses one cp2 loss
  train op_ac 1 --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op
  same_losses one op_ac loss
  resume_from one 3 resumed 1
}
