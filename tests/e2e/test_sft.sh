#!/usr/bin/env bash
# Chat fine-tuning (training.dataset = "chat", src/titan/components/data/sft_data.h) against
# transformers (tests/e2e/sft_reference.py, $TITAN_PYTHON): Hugging Face folders with a small BPE
# tokenizer, the Qwen3 or the Llama 3.1 chat template and a random Qwen3 model; titan's first-step
# loss over packed multi-turn conversations (assistant replies only, global-batch token mean with
# gradient accumulation) equals transformers' within 1e-5 relative. FSDP 2, TP 2, PP 2, CP 2 and
# the fused loss (compile.enable) reproduce the one-process loss curve (1e-5), a resumed run its
# losses; validation runs on chat data, over-long conversations are dropped or truncated and
# counted, and bad rows or settings are clear errors. About 45 s.
source "$(dirname "$0")/parallel_lib.sh"

PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set; ctest sets it, by hand:" \
  "TITAN_PYTHON=\$(scripts/python_env.sh --print) bash $0 $TITAN"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=2
REF="$(dirname "$0")/sft_reference.py"
templates=tests/unit/tokenizer/chat_templates

"$PY" "$REF" make-folder "$WORK/qwen" --template "$templates/Qwen-Qwen3-0.6B.jinja" --style qwen \
  --seed 1 >/dev/null || fail "could not make the Qwen3 folder"
"$PY" "$REF" make-folder "$WORK/llama" --style llama --seed 2 \
  --template "$templates/meta-llama-Llama-3.1-8B-Instruct.jinja" >/dev/null ||
  fail "could not make the Llama folder"

# 40 conversations: one and two turns, some with a system prompt; row 5 is too long for seq_len
# 256 and row 9 has no assistant reply (both counted, not trained).
"$PY" - "$WORK" <<'PYTHON'
import json, random, sys
work = sys.argv[1]
rng = random.Random(7)
words = "the quick brown fox jumps over lazy dog hello there how are you today cat sea boat".split()
say = lambda n: " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."
rows = []
for i in range(40):
    msgs = [{"role": "system", "content": "You are a helpful assistant."}] if i % 3 == 0 else []
    for _ in range(1 + i % 2):
        msgs += [{"role": "user", "content": say(rng.randint(2, 5))},
                 {"role": "assistant", "content": say(rng.randint(2, 6))}]
    if i == 5:
        msgs[-1]["content"] = say(150)
    if i == 9:
        msgs = msgs[:1] if msgs[0]["role"] == "user" else msgs[:2]
    rows.append({"id": i, "messages": msgs})
with open(f"{work}/chats.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
with open(f"{work}/val.jsonl", "w") as f:
    for r in rows[:12]:
        f.write(json.dumps(r) + "\n")
with open(f"{work}/qa.jsonl", "w") as f:
    for r in rows[:8]:
        f.write(json.dumps({"question": r["messages"][-2]["content"],
                            "answer": r["messages"][-1]["content"]}) + "\n")
PYTHON

common=(--job.config_file configs/llama3/debug_model.toml --model.name qwen3 --model.flavor tiny
  --model.hf_assets_path "$WORK/qwen" --checkpoint.initial_load_path "$WORK/qwen"
  --checkpoint.initial_load_in_hf true --training.dataset chat
  --training.dataset_path "$WORK/chats.jsonl" --training.dataset_shuffle false
  --training.seq_len 256 --training.local_batch_size 2 --training.global_batch_size 4
  --training.steps 6 --training.mixed_precision_param float32 --metrics.log_freq 1
  --metrics.peak_flops 1e12 --lr_scheduler.warmup_steps 2 --validation.enable true
  --validation.dataset chat --validation.dataset_path "$WORK/val.jsonl" --validation.freq 3
  --validation.seq_len 256 --validation.local_batch_size 2 --checkpoint.enable true
  --checkpoint.interval 3 --checkpoint.last_save_model_only false)

# One process, two micro-batches of 2 windows per step: the reference takes the first 4 windows.
train one 1
loss1=$(grep -m1 '"loss":' "$WORK/one/metrics.jsonl" | sed -E 's/.*"loss":(-?[0-9.eE+-]+).*/\1/')
"$PY" "$REF" loss "$WORK/qwen" "$WORK/chats.jsonl" --seq-len 256 --batch-size 4 --expect "$loss1" ||
  fail "titan's first-step loss differs from transformers' (Qwen3 template)"
grep -qE "chats.jsonl:6 has [0-9]+ positions, more than seq_len 256; dropped" "$WORK/one.log" ||
  fail "the over-long conversation was not reported as dropped"
grep -q "chats.jsonl:10 has no assistant reply" "$WORK/one.log" ||
  fail "the conversation without a reply was not reported"
grep -q "1 dropped and 0 truncated" "$WORK/one.log" || fail "no epoch summary with the counts"
grep -q '"validation_loss":' "$WORK/one/metrics.jsonl" ||
  fail "no validation on the chat data"

# The same steps split over ranks: losses (mean over the global batch's trained tokens) agree.
train fsdp2 2 --parallelism.data_parallel_shard_degree 2 --training.global_batch_size 4
same_losses one fsdp2 loss
train tp2 2 --parallelism.tensor_parallel_degree 2
same_losses one tp2 loss
train pp2 2 --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_microbatch_size 1
same_losses one pp2 loss
train cp2 2 --parallelism.context_parallel_degree 2
same_losses one cp2 loss
train fused 1 --compile.enable true  # the fused linear + cross-entropy
same_losses one fused loss
resume_from one 3 resumed 1

# The Llama 3.1 template (earlier turns end at <|eot_id|>), one process, one step.
train llama 1 --model.hf_assets_path "$WORK/llama" --checkpoint.initial_load_path "$WORK/llama" \
  --training.steps 1 --validation.enable false --checkpoint.enable false
loss1=$(grep -m1 '"loss":' "$WORK/llama/metrics.jsonl" | sed -E 's/.*"loss":(-?[0-9.eE+-]+).*/\1/')
"$PY" "$REF" loss "$WORK/llama" "$WORK/chats.jsonl" --seq-len 256 --batch-size 4 \
  --expect "$loss1" || fail "titan's first-step loss differs from transformers' (Llama 3.1 template)"

# Question/answer rows, truncation instead of dropping.
train qa 1 --training.dataset_path "$WORK/qa.jsonl" --sft.prompt_field question \
  --sft.response_field answer --training.steps 1 --validation.enable false --checkpoint.enable false
train truncate 1 --sft.overlong truncate --training.steps 3 --validation.enable false \
  --checkpoint.enable false --training.seq_len 96 --training.global_batch_size 8
grep -q "positions, more than seq_len 96; truncated" "$WORK/truncate.log" ||
  fail "sft.overlong = truncate did not report a truncation"

# Errors: one field of a question/answer mapping, rows without the messages field, no template.
expect_exit 2 "$TITAN" train "${common[@]}" --job.dump_folder "$WORK/e1" --sft.prompt_field question
expect_output "question/answer rows need both fields"
expect_exit 1 "$TITAN" train "${common[@]}" --job.dump_folder "$WORK/e2" \
  --training.dataset_path "$WORK/qa.jsonl" --validation.enable false
expect_output "qa.jsonl:1: no \"messages\" field .*HINT: set sft.messages_field"
expect_exit 2 "$TITAN" train "${common[@]}" --job.dump_folder "$WORK/e3" --model.hf_assets_path "" \
  --checkpoint.initial_load_path "" --checkpoint.initial_load_in_hf false
expect_output "model.hf_assets_path is empty"
echo "PASS test_sft"
