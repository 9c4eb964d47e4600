"""Hugging Face transformers' generate loop, timed like `titan generate`, for bench/generate_bench.sh.

Run with the project's Python (scripts/python_env.sh: torch 2.15, transformers). Loads a Llama
folder (written by `titan convert to-hf`) with LlamaForCausalLM.from_pretrained in the given dtype
and runs model.generate greedily (do_sample=False) with its KV cache (use_cache=True) on one
thread, REPEATS times in one process, printing per run:

  hf run=K n_generated=N prefill_s=S decode_tokens_per_s=T

and at the end the last run's whole sequence (prompt and generated ids):

  hf ids ID ID ...

Timing. transformers hands a streamer the prompt before the first forward and each new token
right after it is chosen, so the streamer's clock gives what titan's generator reports:
prefill_s runs from generate's call to the first new token (input preparation, the forward over
the prompt, the first choice), and decode is from the first new token to the last one, i.e.
n_generated - 1 tokens. Model loading and Python start-up are outside both.

--vocab-limit L masks ids >= L before the greedy choice (a one-op logits processor), as titan does
when its tokenizer is smaller than the model's embedding (titan generate's vocab_limit); without
it the two could pick different argmaxes among ids the tokenizer cannot produce. Generation stops
at --eos (default: the folder's eos_token_id, as titan stops at its tokenizer's EOS).
"""
import argparse
import sys
import time

try:
    import torch
    from transformers import LlamaForCausalLM, LogitsProcessor, LogitsProcessorList
    from transformers.generation.streamers import BaseStreamer
    from transformers.utils import logging as hf_logging
except ImportError as e:
    sys.exit(f"error: {sys.executable} cannot import {e.name}: run with the project's Python "
             "(scripts/python_env.sh)")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class TokenClock(BaseStreamer):
    """Records when each new token arrives (the first put is the prompt)."""

    def __init__(self):
        self.prompt_seen = False
        self.times = []

    def put(self, value):
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self):
        pass


class VocabLimit(LogitsProcessor):
    """Ids >= limit can never be chosen."""

    def __init__(self, limit):
        self.limit = limit

    def __call__(self, input_ids, scores):
        scores[:, self.limit:] = -float("inf")
        return scores


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("hf_dir")
    p.add_argument("--prompt-ids", required=True, help='"ID ID ..." fed as given')
    p.add_argument("--new-tokens", type=int, required=True)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--vocab-limit", type=int, default=0)
    p.add_argument("--eos", type=int, default=None)
    p.add_argument("--attn", default="sdpa", help="attn_implementation (default sdpa)")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = LlamaForCausalLM.from_pretrained(args.hf_dir, dtype=DTYPES[args.dtype],
                                             attn_implementation=args.attn).eval()
    vocab = model.config.vocab_size
    processors = LogitsProcessorList()
    if 0 < args.vocab_limit < vocab:
        processors.append(VocabLimit(args.vocab_limit))
    eos = args.eos if args.eos is not None else model.config.eos_token_id
    prompt = torch.tensor([[int(t) for t in args.prompt_ids.split()]])  # (1, n_prompt)
    sequence = None
    for run in range(1, args.repeats + 1):
        clock = TokenClock()
        start = time.perf_counter()
        with torch.inference_mode():
            sequence = model.generate(
                prompt, attention_mask=torch.ones_like(prompt), do_sample=False, use_cache=True,
                max_new_tokens=args.new_tokens, eos_token_id=eos,
                pad_token_id=eos if eos is not None else 0, logits_processor=processors,
                streamer=clock)
        n = len(clock.times)
        prefill = clock.times[0] - start if n else 0.0
        decode = clock.times[-1] - clock.times[0] if n > 1 else 0.0
        tps = (n - 1) / decode if decode > 0 else 0.0
        print(f"hf run={run} n_generated={n} prefill_s={prefill:.4f} "
              f"decode_tokens_per_s={tps:.1f}", flush=True)
    print("hf ids " + " ".join(str(int(t)) for t in sequence[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
