#!/usr/bin/env bash
# `titan tokenizer apply-chat-template` renders conversations exactly as transformers'
# apply_chat_template(..., tokenize=False) (tests/e2e/chat_template_reference.py, with
# $TITAN_PYTHON): Llama 3.1's template from tokenizer_config.json (string tokens), Qwen3's from
# chat_template.jinja (it wins over the config's, as in transformers; AddedToken-style tokens),
# with and without the generation prompt, multi-turn, system prompts, tools, Unicode. Usage and
# data errors exit 2 and 1, naming the file and line. About 10 s.
source "$(dirname "$0")/lib.sh"

PY="${TITAN_PYTHON:-}"
[ -n "$PY" ] || fail "TITAN_PYTHON is not set; ctest sets it, by hand:" \
  "TITAN_PYTHON=\$(scripts/python_env.sh --print) bash $0 $TITAN"
export HF_HUB_OFFLINE=1
REF="$(dirname "$0")/chat_template_reference.py"
templates=tests/unit/tokenizer/chat_templates

cat >"$WORK/chats.jsonl" <<'JSONL'
{"messages": [{"role": "user", "content": "Hello!"}]}
{"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]}
[{"role": "user", "content": "Grüße 🚀 — 你好 {{ not a template }} <|eot_id|>"}, {"role": "assistant", "content": "  Привет  \n"}]
{"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}

{"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}, {"role": "user", "content": "still there?"}]}
JSONL

# Llama 3.1: the template inside tokenizer_config.json, tokens as strings.
llama="$WORK/llama"
mkdir -p "$llama"
"$PY" -c 'import json, sys; print(json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": open(sys.argv[1]).read()}))' \
  "$templates/meta-llama-Llama-3.1-8B-Instruct.jinja" >"$llama/tokenizer_config.json"
# Qwen3: chat_template.jinja beside a config whose own template must lose; AddedToken objects.
qwen="$WORK/qwen"
mkdir -p "$qwen"
cp "$templates/Qwen-Qwen3-0.6B.jinja" "$qwen/chat_template.jinja"
echo '{"eos_token": {"content": "<|im_end|>", "__type": "AddedToken"}, "pad_token": "<|endoftext|>", "chat_template": "WRONG"}' \
  >"$qwen/tokenizer_config.json"

for dir in "$llama" "$qwen"; do
  for gen in "" --add-generation-prompt; do
    expect_exit 0 "$TITAN" tokenizer apply-chat-template --tokenizer "$dir" --input "$WORK/chats.jsonl" $gen
    cp "$WORK/out" "$WORK/ours.jsonl"
    "$PY" "$REF" "$dir" "$WORK/chats.jsonl" $gen >"$WORK/theirs.jsonl" || fail "reference failed for $dir"
    [ "$(wc -l <"$WORK/ours.jsonl")" = 5 ] || fail "$dir $gen: $(wc -l <"$WORK/ours.jsonl") renderings, want 5"
    cmp -s "$WORK/ours.jsonl" "$WORK/theirs.jsonl" || {
      diff "$WORK/ours.jsonl" "$WORK/theirs.jsonl" >&2 || true
      fail "$dir $gen: titan's renderings differ from transformers'"
    }
  done
done
grep -q 'You are terse' "$WORK/ours.jsonl" || fail "the renderings lack the system prompt"

# Errors: no template (exit 2, the files looked for), a malformed line and a conversation that
# is not a list (exit 1, file:line).
mkdir -p "$WORK/none"
echo '{"eos_token": "</s>"}' >"$WORK/none/tokenizer_config.json"
expect_exit 2 "$TITAN" tokenizer apply-chat-template --tokenizer "$WORK/none" --input "$WORK/chats.jsonl"
expect_output "no chat template in .*chat_template.jinja"
printf '[{"role": "user", "content": "ok"}]\n{"messages": [}\n' >"$WORK/bad.jsonl"
expect_exit 1 "$TITAN" tokenizer apply-chat-template --tokenizer "$llama" --input "$WORK/bad.jsonl"
expect_output "bad.jsonl:2: not valid JSON"
printf '{"messages": "hi"}\n' >"$WORK/bad2.jsonl"
expect_exit 1 "$TITAN" tokenizer apply-chat-template --tokenizer "$llama" --input "$WORK/bad2.jsonl"
expect_output "bad2.jsonl:1: the messages are string, not a list"
expect_exit 2 "$TITAN" tokenizer apply-chat-template --input "$WORK/chats.jsonl"
expect_output "--tokenizer is required"
echo "ok"
