"""transformers as the reference for titan's chat fine-tuning data and loss (test_sft.sh).

Run with the project's Python ($TITAN_PYTHON). Commands:

  make-folder OUT --template FILE.jinja --style qwen|llama [--seed N]
      A Hugging Face folder with a small byte-level BPE tokenizer (trained here with `tokenizers`
      on a fixed text, vocabulary <= 300, the chat template's special tokens added), a
      tokenizer_config.json holding the chat template and the special tokens transformers hands
      it, and a random Qwen3ForCausalLM of titan's qwen3 `tiny` sizes (float32).
  loss HF_DIR CHATS.jsonl --seq-len S --batch-size B --expect LOSS [--rtol 1e-5]
      The loss of titan's first step, computed independently: every conversation rendered with
      tokenizer.apply_chat_template, the trained text of each assistant message found by the rule
      of src/titan/components/data/sft_data.h (from the prompt rendered with the generation
      prompt to the end, or through the first eos_token for earlier turns), the pieces
      tokenized apart, then greedy packing in file order into windows of S positions, and the
      first B windows' conversations run through the model one by one (their own positions, as
      the packed block-causal attention gives them). The loss is the mean cross-entropy over
      the trained tokens; it must equal LOSS within rtol.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_transformers_reference as qwen3_ref  # noqa: E402

STYLES = {
    "qwen": {"special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
             "config": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}},
    "llama": {"special": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                          "<|end_header_id|>", "<|eot_id|>"],
              "config": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}},
}
TEXT = ("The quick brown fox jumps over the lazy dog. Hello there! How are you today? "
        "I am fine, thank you. What is two plus two? It is four. Tell me a story about a cat "
        "who sails the sea. Once upon a time, a small cat built a boat of paper and sailed "
        "away. system user assistant Cutting Knowledge Date: December 2023 Today Date: 26 Jul "
        "2024 You are a helpful assistant. think ") * 20


def make_folder(args):
    style = STYLES[args.style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=290, special_tokens=style["special"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([TEXT], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **style["config"])
    fast.chat_template = open(args.template).read()
    fast.save_pretrained(args.out)
    vocab = len(fast)
    assert vocab <= 300, vocab
    # The model: qwen3_transformers_reference's random Qwen3, whose defaults are titan's `tiny`.
    model_args = qwen3_ref.parser().parse_args(["save-random", args.out, "--seed", str(args.seed)])
    model_args.run(model_args)
    print(f"{args.out}: tokenizer of {vocab} tokens, random Qwen3 (tiny sizes)")
    return True


def render(tok, messages, generation_prompt):
    return tok.apply_chat_template(messages, tokenize=False,
                                   add_generation_prompt=generation_prompt)


def trained_spans(tok, messages):
    """The rendering and the trained character ranges (sft_data.h's rule)."""
    full = render(tok, messages, False)
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    starts = []
    for i in assistants:
        prompt = render(tok, messages[:i], True)
        assert full.startswith(prompt), f"the prompt of message {i} is not a prefix"
        starts.append(len(prompt))
    spans = []
    for a, begin in enumerate(starts):
        if a + 1 == len(starts):
            spans.append((begin, len(full)))
        else:
            end = full.index(tok.eos_token, begin) + len(tok.eos_token)
            assert end <= starts[a + 1]
            spans.append((begin, end))
    return full, spans


def sample(tok, messages):
    full, spans = trained_spans(tok, messages)
    ids, trained = [], []
    at = 0
    pieces = []
    for begin, end in spans:
        pieces += [(at, begin, False), (begin, end, True)]
        at = end
    pieces.append((at, len(full), False))
    for begin, end, is_trained in pieces:
        if end <= begin:
            continue
        part = tok(full[begin:end], add_special_tokens=False)["input_ids"]
        ids += part
        trained += [is_trained] * len(part)
    return ids, trained


def loss(args):
    tok = AutoTokenizer.from_pretrained(args.hf_dir)
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    windows, used = [[]], 0
    for line in open(args.chats):
        if not line.strip():
            continue
        ids, trained = sample(tok, json.loads(line)["messages"])
        n = len(ids) - 1
        if n < 1 or not any(trained[1:]) or n > args.seq_len:
            continue  # titan skips (no reply) or drops (too long) these, as the test's data has none
        if used + n > args.seq_len:
            if len(windows) == args.batch_size:
                break
            windows.append([])
            used = 0
        windows[-1].append((ids, trained))
        used += n
    assert len(windows) == args.batch_size, f"only {len(windows)} windows"
    total, count = 0.0, 0
    with torch.no_grad():
        for window in windows:
            for ids, trained in window:
                x = torch.tensor([ids[:-1]])
                logits = model(input_ids=x).logits[0].float()
                target = torch.tensor([t if tr else -100 for t, tr in zip(ids[1:], trained[1:])])
                total += F.cross_entropy(logits, target, reduction="sum", ignore_index=-100).item()
                count += int((target != -100).sum())
    value = total / count
    diff = abs(value - args.expect)
    ok = diff <= args.rtol * abs(value)
    print(f"{'ok' if ok else 'FAIL'}: {args.hf_dir}: first-step SFT loss: transformers "
          f"{value:.7f} over {count} trained tokens in {sum(len(w) for w in windows)} "
          f"conversations, titan {args.expect:.7f} (|diff| {diff:.2e}, rtol {args.rtol})")
    return ok


def main(argv):
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("make-folder")
    s.add_argument("out")
    s.add_argument("--template", required=True)
    s.add_argument("--style", choices=sorted(STYLES), required=True)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(run=make_folder)
    s = sub.add_parser("loss")
    s.add_argument("hf_dir")
    s.add_argument("chats")
    s.add_argument("--seq-len", type=int, required=True)
    s.add_argument("--batch-size", type=int, required=True)
    s.add_argument("--expect", type=float, required=True)
    s.add_argument("--rtol", type=float, default=1e-5)
    s.set_defaults(run=loss)
    args = p.parse_args(argv)
    return 0 if args.run(args) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
