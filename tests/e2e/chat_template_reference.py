"""What transformers renders for `titan tokenizer apply-chat-template`.

usage: chat_template_reference.py DIR INPUT.jsonl [--add-generation-prompt]

Reads the chat template and special tokens of the tokenizer folder DIR as transformers does
(chat_template.jinja over tokenizer_config.json's "chat_template"), renders each conversation of
INPUT.jsonl ({"messages": [...], "tools": [...]} or a list of messages) with
apply_chat_template(..., tokenize=False) and prints each rendering as a JSON string per line (UTF-8,
as titan writes it), the output titan's command must match. The tokenizer is built in memory (no
hub access): the template reads only the special tokens' strings.
"""
import json
import pathlib
import sys

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    add_generation_prompt = "--add-generation-prompt" in sys.argv[1:]
    folder, conversations = pathlib.Path(args[0]), pathlib.Path(args[1])
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    special = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            special[name] = value
    jinja = folder / "chat_template.jinja"
    template = jinja.read_text() if jinja.exists() else config["chat_template"]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), **special)
    tokenizer.chat_template = template
    for line in conversations.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        messages = row["messages"] if isinstance(row, dict) else row
        extra = {k: row[k] for k in ("tools", "documents") if isinstance(row, dict) and k in row}
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra)
        print(json.dumps(text, ensure_ascii=False))


if __name__ == "__main__":
    main()
