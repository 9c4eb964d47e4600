#!/usr/bin/env bash
# The fine-tuning example (configs/qwen3/sft_lora_tiny.toml): makes its inputs once with the
# project's Python (tests/e2e/sft_reference.py's random Qwen3 folder with a small BPE tokenizer
# and Qwen3's chat template, and 200 generated conversations), then trains LoRA adapters on them.
#
#   bash scripts/sft_lora_example.sh                          # into outputs/sft_lora_example
#   SFT_EXAMPLE_DIR=/tmp/ex bash scripts/sft_lora_example.sh --training.steps 5
#
# Extra arguments are config overrides. The run ends with step-60-hf (merged weights) and
# step-60-peft (the adapters, for peft) under $SFT_EXAMPLE_DIR/run/checkpoint.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${SFT_EXAMPLE_DIR:-$root/outputs/sft_lora_example}"
titan="${TITAN:-$root/build/titan}"
[ -x "$titan" ] || { echo "sft_lora_example.sh: $titan not found; run scripts/setup.sh" >&2; exit 2; }
python="$(bash "$root/scripts/python_env.sh")"
mkdir -p "$out"
if [ ! -f "$out/model/config.json" ]; then
  "$python" "$root/tests/e2e/sft_reference.py" make-folder "$out/model" --style qwen --seed 1 \
    --template "$root/tests/unit/tokenizer/chat_templates/Qwen-Qwen3-0.6B.jinja"
fi
if [ ! -f "$out/chats.jsonl" ]; then
  "$python" - "$out/chats.jsonl" <<'PYTHON'
import json, random, sys
rng = random.Random(7)
words = "the quick brown fox jumps over lazy dog hello there how are you today cat sea boat".split()
say = lambda n: " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."
with open(sys.argv[1] + ".tmp", "w") as f:
    for i in range(200):
        msgs = [{"role": "system", "content": "You are a helpful assistant."}] if i % 3 == 0 else []
        for _ in range(1 + i % 2):
            msgs += [{"role": "user", "content": say(rng.randint(2, 5))},
                     {"role": "assistant", "content": say(rng.randint(2, 6))}]
        f.write(json.dumps({"messages": msgs}) + "\n")
PYTHON
  mv "$out/chats.jsonl.tmp" "$out/chats.jsonl"
fi
exec "$titan" train --job.config_file "$root/configs/qwen3/sft_lora_tiny.toml" \
  --model.hf_assets_path "$out/model" --checkpoint.initial_load_path "$out/model" \
  --training.dataset_path "$out/chats.jsonl" --job.dump_folder "$out/run" "$@"
