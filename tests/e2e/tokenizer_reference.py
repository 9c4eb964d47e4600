"""Reference token ids from the pinned Python libraries: Hugging Face `tokenizers` (Rust, the
library behind every tokenizer.json, and so behind transformers' T5 and CLIP tokenizers) and
OpenAI's `tiktoken` (what Llama 3's tokenizer.model is read with). Used by tests/e2e/test_tokenizer_reference.sh, run with the project's Python
($TITAN_PYTHON, scripts/python_env.sh). Nothing is downloaded: tiktoken's GPT-2 encoding is
built from local copies of its files, checked against the hashes tiktoken pins.

  tokenizer_reference.py prepare GPT2_DIR OUT_DIR
      from GPT-2's encoder.json + vocab.bpe (scripts/fetch_gpt2_tokenizer.sh) writes
        OUT_DIR/gpt2_json/tokenizer.json    tokenizers' BPE + ByteLevel, <|endoftext|> added
        OUT_DIR/gpt2_llama3/tokenizer.json  the same vocabulary with Llama 3's pre-tokenizer
                                            (Split regex, ByteLevel without regex, ignore_merges)
        OUT_DIR/gpt2.tiktoken               tiktoken's GPT-2 ranks as a rank file (base64 rank)
  tokenizer_reference.py prepare-t5-clip CORPUS_DIR OUT_DIR
      T5's and CLIP's tokenizer files, trained on the corpus and written by transformers:
        OUT_DIR/t5_spm/spiece.model         SentencePiece unigram, nmt_nfkc rules, 5 sentinels
        OUT_DIR/t5/tokenizer.json           transformers' T5Tokenizer of it
        OUT_DIR/clip_files/vocab.json + merges.txt   byte-level BPE with "</w>", CLIP's layout
        OUT_DIR/clip/tokenizer.json         transformers' CLIPTokenizer of them
  tokenizer_reference.py with-prefix-space IN_JSON OUT_JSON
      a copy of a tokenizer.json whose ByteLevel pre-tokenizer has add_prefix_space: true
  tokenizer_reference.py compare --titan BIN --tokenizer PATH --reference KIND:PATH --work DIR
                                 [--corpus DIR [--whole-corpus]] [--adversarial] [--random N]
                                 [--decode]
      `titan tokenizer encode` ids == the reference's ids on every document of the corpus (its
      *.txt, one document each), the adversarial strings and N characters of random Unicode,
      each text on its own, then on all of them as one text (the corpus only with
      --whole-corpus), which adds line breaks of every kind; --decode: the reference must also
      decode its ids of that text back to the text. KIND: hf (a tokenizer.json), hf-gpt2
      (tokenizers' BPE from GPT2_DIR's vocabulary and merges), tiktoken-gpt2 (tiktoken's own
      "gpt2" encoding from GPT2_DIR), tiktoken-file (a rank file with Llama 3's regex, as titan
      reads such files). On a difference prints the first differing text, the position and both
      id windows; exit 1.
  tokenizer_reference.py unicode-tables [--check FILE]
      prints src/titan/components/tokenizer/unicode_tables.cpp: \\p{L}, \\p{N} and \\s as both
      libraries' regex engines see them (they must agree); --check: exit 1 unless FILE holds
      exactly tiktoken's ranges (tokenizers' engine takes seconds to ask, and agreed when the
      file was generated).
  tokenizer_reference.py normalizer-tables [--check FILE]
      prints src/titan/components/tokenizer/unicode_norm_tables.cpp (lowercase, NFD, NFC
      compositions, grapheme classes; see normalizer_data); --check: exit 1 unless FILE holds
      exactly those tables.
  tokenizer_reference.py pre-tokenizer-cases
      prints tests/unit/tokenizer/pre_tokenizer_cases.json: adversarial strings and their pieces
      under the GPT-2 and Llama 3 regexes, split by tokenizers' regex engine.
"""
import argparse
import base64
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken: no cache folder, files are read where they are

import tiktoken
import tiktoken.load
import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# The regexes titan implements (pre_tokenizer.h), spelled as GPT-2's encoder and Llama 3's
# tokenizer.json / tokenizer.py spell them.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
THREADS = int(os.environ.get("RAYON_NUM_THREADS", "2"))


# ---- references -----------------------------------------------------------------------------


def tiktoken_gpt2(gpt2_dir):
    """The arguments of tiktoken's registered "gpt2" encoding (its pattern, ranks, special token),
    reading the two files it would download from GPT2_DIR instead; tiktoken checks their sha256
    as it caches them (in a temporary folder)."""
    from tiktoken_ext import openai_public

    original = tiktoken.load.read_file

    def read_local(blobpath):
        name = blobpath.rsplit("/", 1)[-1]
        if name not in ("vocab.bpe", "encoder.json"):
            raise RuntimeError(f"tiktoken asked for {blobpath}; only GPT-2's files are local")
        return original(os.path.join(gpt2_dir, name))

    tiktoken.load.read_file = read_local
    try:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TIKTOKEN_CACHE_DIR"] = cache
            return openai_public.gpt2()
    finally:
        tiktoken.load.read_file = original
        os.environ["TIKTOKEN_CACHE_DIR"] = ""


def hf_gpt2(gpt2_dir, pre_tokenizer=None, ignore_merges=False):
    """tokenizers' byte-level BPE from GPT-2's vocabulary and merges (no added tokens)."""
    model = models.BPE.from_file(
        os.path.join(gpt2_dir, "encoder.json"),
        os.path.join(gpt2_dir, "vocab.bpe"),
        ignore_merges=ignore_merges,
    )
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


class Reference:
    """encode(list of str) -> list of id lists, for one KIND:PATH."""

    def __init__(self, spec):
        self.kind, _, self.path = spec.partition(":")
        if self.kind == "hf":
            self.hf = Tokenizer.from_file(self.path)
        elif self.kind == "hf-gpt2":
            self.hf = hf_gpt2(self.path)
        elif self.kind == "tiktoken-gpt2":
            self.tt = tiktoken.Encoding(**tiktoken_gpt2(self.path))
        elif self.kind == "tiktoken-file":
            self.tt = tiktoken.Encoding(
                name=os.path.basename(self.path),
                pat_str=LLAMA3_PATTERN,
                mergeable_ranks=tiktoken.load.load_tiktoken_bpe(self.path),
                special_tokens={},
            )
        else:
            raise SystemExit(f"unknown reference kind '{self.kind}' in '{spec}'")
        # e.g. "hf bpe/tokenizer.json", "tiktoken-gpt2 gpt2"
        self.name = f"{self.kind} {'/'.join(self.path.rstrip('/').split('/')[-2:])}"
        if self.kind != "hf":
            self.name = f"{self.kind} {os.path.basename(self.path.rstrip('/'))}"

    def encode(self, texts):
        if hasattr(self, "hf"):
            encodings = self.hf.encode_batch(texts, add_special_tokens=False)
            return [e.ids for e in encodings]
        # titan never matches special-token text in these files: encode_ordinary.
        return self.tt.encode_ordinary_batch(texts, num_threads=THREADS)

    def decode(self, ids):
        if hasattr(self, "hf"):
            return self.hf.decode(ids, skip_special_tokens=False)
        return self.tt.decode_bytes(ids).decode("utf-8", errors="replace")


# ---- inputs ---------------------------------------------------------------------------------


def adversarial_strings():
    """Single-line strings (no '\\n'), each compared on its own; invisible characters escaped."""
    return [
        "Hello world", "   leading spaces and trailing spaces     ",
        "tabs\tand\tmixed \t \twhitespace  \t",
        # Contractions: ASCII and typographic apostrophes, any case; U+017F (long s) and U+212A
        # (Kelvin sign) case-fold to s and k; U+0130 and U+0131, dotted and dotless i.
        "I'm you're they'll we've he'd it's DON'T 'S ''s 're' o'clock rock'n'roll",
        "I’m you’re they’ll DON’T ‘quoted’ “double”",
        "It'S IT'LL We'VE 'Ll 'rE 'D 'M 'T 'x '' '''' 'ss",
        "'ſ 'ſt ſ'ſ '\u212a 'K 'k 'İ 'ı 'S\u0301 'ﬅ",
        # Numbers: runs longer than Llama 3's groups of three, other scripts' digits, Nl and No.
        "1234567890 3.14159 1,000,000 2024-01-01 +1 (555) 123-4567 0x1F 1e-9 007",
        "1" * 61, "12 345 6789 12345678901234567890 99.999,99",
        "١٢٣ १२३ １２３ ½¾⅓ ⅫⅯ ²³ ①② 𝟎𝟏 𒐀𒐁 〇〡 x²+y²=z²",
        # Combining marks, emoji sequences, scripts without spaces, right to left.
        "combining: e\u0301 é n\u0303\u0303 a\u0308\u0304 "
        "Z\u0337\u0322\u031ba\u0336l\u0338g\u0335o",
        "\u0301\u0301\u0301 leading combining marks \u0301 after space",
        "emoji 🙂🙂👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳\ufe0f\u200d🌈",
        "flags 🇺🇸🇯🇵 keycap 1\ufe0f\u20e3 #\ufe0f\u20e3 ☺\ufe0e☺\ufe0f",
        "中文字符和日本語のテキスト。、 한국어 \u1100\u1161\u11a8",
        "ภาษาไทย हिन्दी മലയാളം ក្ម",
        "Ελληνικά кириллица עִבְרִית العَرَبِيَّة",
        "rtl marks: a\u200fb\u200ec \u202eevil\u202c \u2066iso\u2069 \u061c",
        "zero\u200bwidth non\u200cjoiner jo\u200diner word\u2060joiner soft\u00adhyphen",
        # Every kind of space; NEL (a space to the regex engines), BOM and U+180E (not spaces).
        "spaces: a\u00a0b\u202fc\u2007d\u3000e\u2002f\u2003g\u2009h\u200ai\u1680j\u205fk",
        "line seps: a\u2028b\u2029c nel:\u0085x \u0085 y\u0085\u0085z bom:\ufeffq \ufeff r "
        "mvs:\u180es",
        "\ufeffstarts with a byte order mark",
        "controls \x00\x01\x02\x07\x08 \x0b\x0c \x1b[31mred\x1b[0m \x1c\x1d\x1e\x1f \x7f \x80\x9f",
        "carriage\rreturn\r \r\r  \rx",
        # Long runs.
        " " * 1000 + "x", "\t" * 100 + "tabs", " \t " * 50, " " * 3000, "\u3000" * 40 + "wide",
        "a" * 5000, "ab" * 2000, "™" * 400, "😀" * 300, "!" * 1000, ".-" * 500,
        "$%^&*()_+{}|:\"<>?~`-=[]\\;',./ !!!??? ... … — «»",
        "https://example.com/a/b?q=1&r=%20#frag user@example.org C:\\path\\file.txt",
        "def f(x): return x**2  # comment; if (a && b || !c) { y += 1; }",
        '{"key": [1, 2.5, null, true], "nested": {"s": "v\\"q"}}',
        # Text that is, or looks like, special tokens.
        "<|endoftext|> <|begin_of_text|> <|end_of_text|> <|eot_id|> <|reserved_special_token_0|>",
        "x<|endoftext|>y<|begin_of_text|>z<|end_of_text|>w <|end_of_text|><|end_of_text|>",
        "<|endoftext| <|endoftext <<|endoftext|>> <|ENDOFTEXT|> < |endoftext| > "
        "<|end_of_<|end_of_text|>text|>",
        "<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>",
        # Private use, noncharacters, unassigned, letters outside the BMP, letters of Unicode 16.0
        # (Garay, Todhri) and 17.0 (Sidetic, CJK extension J: not letters to these libraries).
        "private use \ue000\uf8ff \U000f0000 \U0010fffd "
        "noncharacters \ufdd0 \ufffe\uffff \U0010ffff",
        "unassigned \u0378\u0379 \U000e0000 replacement \ufffd\ufffd specials \ufff9\ufffa\ufffb",
        "𝐀𝐁𝐂 ℌℂ 𐐀𐐨 \U00010d4a\U000105c0 \U00010940\U000323b0",
        "tag chars \U000e0041\U000e0062 variation 辺\U000e0100 🏴\U000e0067\U000e0062\U000e0065"
        "\U000e006e\U000e0067\U000e007f",
        "naïve café résumé Łódź Straße Ångström İstanbul",
        "", " ", "'", "a",
    ]


def adversarial_text():
    """A multi-line text: line breaks of every kind between and inside the strings above."""
    parts = adversarial_strings()
    seps = ["\n", "\r\n", "\n\n", " \n ", "\r", "\n\r\n  \n", "\t\n", "\u2028", "\n\u0085\n",
            "  \n\n\n"]
    out = []
    for i, p in enumerate(parts):
        out.append(p)
        out.append(seps[i % len(seps)])
    out.append("def f(x):\n    return x**2\n\n\n\tindented\n    \n")
    return "".join(out)


def random_unicode(n, seed):
    """N characters: runs from scripts, digits, punctuation, emoji, every kind of space, plus any
    code point at all (assigned or not), with line breaks."""
    rng = random.Random(seed)
    ranges = [
        (0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x17F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
        (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1680, 0x1680), (0x180E, 0x180E),
        (0x2000, 0x206F), (0x2070, 0x218F), (0x3000, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xACFF),
        (0xFE00, 0xFFFF), (0x10000, 0x1FFFF), (0x1F300, 0x1F6FF), (0x85, 0x85), (0x30, 0x39),
        (0x00, 0x1F),
    ]
    out = []
    size = 0
    while size < n:
        r = rng.random()
        if r < 0.15:
            out.append(" ")
        elif r < 0.16:
            out.append("\n")
        elif r < 0.18:
            out.append(rng.choice(["'s", "'T", "'re", "'LL", "\u2019s", "\r\n", "  ", "'\u017f"]))
        elif r < 0.22:
            cp = rng.randrange(0x110000)  # anything but surrogates
            out.append(chr(cp) if not 0xD800 <= cp <= 0xDFFF else "\ufffd")
        else:
            lo, hi = rng.choice(ranges)
            out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
        size += len(out[-1])
    return "".join(out)


def split_lines(text):
    """Lines as `titan tokenizer encode` reads them: split at '\\n' only; a last line without
    '\\n' counts; an empty text has none."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


# ---- comparison -----------------------------------------------------------------------------


def titan_ids(titan, tokenizer, path, whole):
    cmd = [titan, "tokenizer", "encode", "--tokenizer", tokenizer, "--input", path]
    if whole:
        cmd.append("--whole")
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout.decode()
    return [[int(t) for t in line.split()] for line in split_lines(out)]


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def report(ref, label, name, ours, theirs):
    k = first_difference(ours, theirs)
    lo, hi = max(0, k - 8), k + 8
    print(f"FAIL: {label}: {name}: titan and {ref.name} differ at id {k} "
          f"(lengths {len(ours)} vs {len(theirs)})", file=sys.stderr)
    print(f"  titan:     [{lo}:{hi}] {ours[lo:hi]}", file=sys.stderr)
    print(f"  reference: [{lo}:{hi}] {theirs[lo:hi]}", file=sys.stderr)
    for who, ids in (("titan's", ours), ("reference's", theirs)):
        try:
            text = repr(ref.decode(ids[lo:hi]))
        except Exception:  # an id the reference does not know
            text = "(not decodable by the reference)"
        print(f"  {who} text there: {text}", file=sys.stderr)


def compare(args):
    ref = Reference(args.reference)
    groups = []  # (label, texts, names): one text per line of titan's input
    wholes = []  # (label, text): joined into one text, encoded with --whole
    if args.corpus:
        files = sorted(f for f in os.listdir(args.corpus) if f.endswith(".txt"))
        docs = []
        for f in files:
            with open(os.path.join(args.corpus, f), encoding="utf-8", newline="") as fh:
                docs.append(fh.read())
        # Each document is one line, maybe with a final '\n' (the whole text keeps those).
        lines = [d[:-1] if d.endswith("\n") else d for d in docs]
        for f, line in zip(files, lines):
            if "\n" in line:
                raise SystemExit(f"{f}: a document with inner line breaks; compare it whole")
        groups.append((f"{len(files)} documents", lines, files))
        if args.whole_corpus:
            wholes.append(("the corpus", "".join(docs)))
    if args.adversarial:
        strings = adversarial_strings()
        groups.append((f"{len(strings)} adversarial strings", strings,
                       [f"string {i} {s[:60]!r}" for i, s in enumerate(strings)]))
        wholes.append(("the adversarial text", adversarial_text()))
    if args.random:
        text = random_unicode(args.random, seed=1234)
        lines = split_lines(text)
        groups.append((f"{len(lines)} lines of random Unicode", lines,
                       [f"random line {i + 1}" for i in range(len(lines))]))
        wholes.append(("the random text", text))

    # One titan run for all the lines and one for the whole text: starting titan takes a second.
    ok = True
    start = time.time()
    texts = [t for _, group, _ in groups for t in group]
    path = os.path.join(args.work, "reference_lines.txt")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("".join(t + "\n" for t in texts))
    ours = titan_ids(args.titan, args.tokenizer, path, whole=False)
    theirs = ref.encode(texts)
    if len(ours) != len(theirs):
        raise SystemExit(f"FAIL: titan printed {len(ours)} lines for {len(theirs)} texts")
    first = 0
    for label, group, names in groups:
        count = 0
        for name, a, b in zip(names, ours[first:], theirs[first:]):
            if a != b:
                report(ref, label, name, a, b)
                ok = False
                break
            count += len(b)
        else:
            print(f"{ref.name}: {label}, one by one: {count} ids identical")
        first += len(group)
    if wholes:
        label = " + ".join(label for label, _ in wholes) + " as one text"
        text = "".join(t for _, t in wholes)
        path = os.path.join(args.work, "reference_whole.txt")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        (ours,) = titan_ids(args.titan, args.tokenizer, path, whole=True)
        (theirs,) = ref.encode([text])
        if ours != theirs:
            report(ref, label, f"{len(text)} characters", ours, theirs)
            ok = False
        else:
            print(f"{ref.name}: {label}: {len(theirs)} ids identical")
        if args.decode and ref.decode(theirs) != text:
            print(f"FAIL: {ref.name} does not decode its ids of {label} back to the text",
                  file=sys.stderr)
            ok = False
    print(f"{ref.name}: {time.time() - start:.1f} s")
    return 0 if ok else 1


# ---- files for titan ------------------------------------------------------------------------


def prepare(args):
    gpt2, out = args.gpt2_dir, args.out_dir
    os.makedirs(os.path.join(out, "gpt2_json"), exist_ok=True)
    os.makedirs(os.path.join(out, "gpt2_llama3"), exist_ok=True)
    # GPT-2 as a tokenizer.json, laid out as Hugging Face's own gpt2 tokenizer.json.
    tok = hf_gpt2(gpt2)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    tok.save(os.path.join(out, "gpt2_json", "tokenizer.json"))
    # Llama 3's pre-tokenization over GPT-2's vocabulary, laid out as Llama 3's tokenizer.json.
    split = pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok = hf_gpt2(gpt2, pre_tokenizers.Sequence([split, byte_level]), ignore_merges=True)
    tok.save(os.path.join(out, "gpt2_llama3", "tokenizer.json"))
    # tiktoken's GPT-2 ranks (from the merges, in tiktoken's own loader) as a rank file.
    ranks = tiktoken_gpt2(gpt2)["mergeable_ranks"]
    with open(os.path.join(out, "gpt2.tiktoken"), "wb") as f:
        for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
            f.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
    return 0


def bytes_to_unicode_chars():
    """GPT-2's (and CLIP's) printable character for each byte, in byte order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
                 + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    chars = {b: b for b in printable}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + n
            n += 1
    return [chr(chars[b]) for b in range(256)]


def prepare_t5_clip(args):
    """T5's and CLIP's tokenizer files as transformers writes them, trained on the corpus:
    OUT/t5_spm/spiece.model (+ tokenizer_config.json): a SentencePiece unigram model with the
    nmt_nfkc rules (T5's), OUT/t5/tokenizer.json: transformers' T5Tokenizer of it;
    OUT/clip_files/vocab.json + merges.txt: a byte-level BPE with "</w>" word ends in CLIP's
    layout, OUT/clip/tokenizer.json: transformers' CLIPTokenizer of them."""
    import sentencepiece
    from tokenizers import normalizers, trainers
    from transformers import CLIPTokenizer, T5Tokenizer
    files = sorted(os.path.join(args.corpus, f) for f in os.listdir(args.corpus)
                   if f.endswith(".txt"))[:40]
    text = "".join(open(f, encoding="utf-8").read() for f in files)
    sentences = [s.strip() + "." for s in text.split(". ") if s.strip()]
    spm_dir = os.path.join(args.out_dir, "t5_spm")
    os.makedirs(spm_dir, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=os.path.join(spm_dir, "spiece"),
        vocab_size=1000, model_type="unigram", normalization_rule_name="nmt_nfkc", pad_id=0,
        eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, minloglevel=2,
        num_threads=THREADS)
    os.remove(os.path.join(spm_dir, "spiece.vocab"))
    with open(os.path.join(spm_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "T5Tokenizer", "extra_ids": 5}, f)
    T5Tokenizer.from_pretrained(spm_dir, extra_ids=5).save_pretrained(
        os.path.join(args.out_dir, "t5"))

    pattern = (r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|"""
               r"""[\p{N}]|[^\s\p{L}\p{N}]+""")
    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    bpe.normalizer = normalizers.Sequence([normalizers.NFC(),
                                           normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Lowercase()])
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.train(files, trainers.BpeTrainer(vocab_size=1500, end_of_word_suffix="</w>",
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                         show_progress=False))
    merges = json.loads(bpe.to_str())["model"]["merges"]
    chars = bytes_to_unicode_chars()
    vocab = (chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges]
             + ["<|startoftext|>", "<|endoftext|>"])
    clip_dir = os.path.join(args.out_dir, "clip_files")
    os.makedirs(clip_dir, exist_ok=True)
    with open(os.path.join(clip_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(clip_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    CLIPTokenizer.from_pretrained(clip_dir).save_pretrained(os.path.join(args.out_dir, "clip"))
    return 0


def with_prefix_space(args):
    with open(args.input, encoding="utf-8") as f:
        root = json.load(f)
    pre = root["pre_tokenizer"]
    assert pre["type"] == "ByteLevel", pre
    pre["add_prefix_space"] = True
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(root, f, ensure_ascii=False)
    return 0


# ---- generated test data --------------------------------------------------------------------


def reference_classes(check_tokenizers=True):
    """{'L', 'N', 's'} -> set of code points in \\p{L}, \\p{N}, \\s for tiktoken's regex engine
    (fancy-regex; an encoding keeps only the matched text) and, unless told not to (it takes
    seconds), for tokenizers' (a Split that removes the matches); the two must agree."""
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    byte_ranks = {bytes([b]): b for b in range(256)}
    classes = {}
    for name, pattern in (("L", r"\p{L}"), ("N", r"\p{N}"), ("s", r"\s")):
        enc = tiktoken.Encoding(name="probe", pat_str=pattern, mergeable_ranks=byte_ranks,
                                special_tokens={})
        by_tiktoken = set(enc.decode_bytes(enc.encode_ordinary(text)).decode("utf-8"))
        if check_tokenizers:
            split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
            by_tokenizers = set(text) - set("".join(p for p, _ in split.pre_tokenize_str(text)))
            if by_tiktoken != by_tokenizers:
                diff = sorted(ord(c) for c in by_tiktoken ^ by_tokenizers)
                raise SystemExit(f"tiktoken and tokenizers disagree on {pattern} for "
                                 f"{len(diff)} code points, e.g. {[hex(c) for c in diff[:10]]}")
        classes[name] = {ord(c) for c in by_tiktoken}
    return classes


def ranges_of(code_points):
    out = []
    for c in sorted(code_points):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


TABLE_NAMES = (("L", "kLetterRanges"), ("N", "kNumberRanges"), ("s", "kSpaceRanges"))


def unicode_tables(args):
    classes = reference_classes(check_tokenizers=not args.check)
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            source = f.read()
        ok = True
        for key, name in TABLE_NAMES:
            body = source.split(f"const CodePointRange {name}[] = {{", 1)[1].split("};", 1)[0]
            pairs = re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", body)
            ours = {c for a, b in pairs for c in range(int(a, 16), int(b, 16) + 1)}
            if ours != classes[key]:
                diff = sorted(ours ^ classes[key])
                print(f"FAIL: {args.check}: {name} differs from the libraries' regex class on "
                      f"{len(diff)} code points, e.g. {[hex(c) for c in diff[:10]]}; regenerate "
                      f"it with tests/e2e/tokenizer_reference.py unicode-tables", file=sys.stderr)
                ok = False
        if ok:
            print(f"{args.check}: \\p{{L}} \\p{{N}} \\s agree with tiktoken's regex engine")
        return 0 if ok else 1
    out = [
        f"// GENERATED by tests/e2e/tokenizer_reference.py unicode-tables (tokenizers "
        f"{tokenizers.__version__},\n"
        f"// tiktoken {tiktoken.__version__}); do not edit. Sorted, disjoint code point ranges of "
        f"the regex classes\n"
        f"// \\p{{L}}, \\p{{N}} and \\s as both libraries' regex engines match them (\\s: Unicode "
        f"White_Space).\n",
        '#include "titan/components/tokenizer/unicode.h"\n\nnamespace titan {\n'
        "namespace unicode_tables {\n\n",
    ]
    for key, name in TABLE_NAMES:
        ranges = ranges_of(classes[key])
        rows = []
        for i in range(0, len(ranges), 4):
            row = ", ".join(f"{{0x{a:X}, 0x{b:X}}}" for a, b in ranges[i:i + 4])
            rows.append(f"    {row},")
        out.append(f"const CodePointRange {name}[] = {{\n" + "\n".join(rows) + "\n};\n")
        out.append(f"const size_t {name}_size = {len(ranges)};\n\n")
    out.append("}  // namespace unicode_tables\n}  // namespace titan\n")
    sys.stdout.write("".join(out))
    return 0


# Grapheme cluster break classes (UAX #29) packed with Extended_Pictographic and Indic_Conjunct_Break
# into one byte per code point, as src/titan/components/tokenizer/unicode_norm.h reads them.
GCB_VALUES = ["Other", "CR", "LF", "Control", "Extend", "ZWJ", "Regional_Indicator", "Prepend",
              "SpacingMark", "L", "V", "T", "LV", "LVT"]
INCB_VALUES = {"Linker": 1, "Consonant": 2, "Extend": 3}


def normalizer_data():
    """The Unicode data behind titan's normalizers, asked of the libraries that define the
    reference behaviour: Lowercase and NFD of every code point from tokenizers' normalizers,
    canonical combining classes and composition pairs from unicodedata2 (checked against
    tokenizers' NFC), grapheme classes from the regex module (UAX #29 properties)."""
    import regex
    import unicodedata2
    from tokenizers import normalizers
    chars = [chr(c) for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    joined = "\x00".join(chars)
    lower = normalizers.Lowercase().normalize_str(joined).split("\x00")
    nfd = normalizers.NFD().normalize_str(joined).split("\x00")
    assert len(lower) == len(chars) and len(nfd) == len(chars)
    data = {"lower": {}, "nfd": {}, "ccc": {}, "compose": [], "grapheme": {}}
    for c, lo, d in zip(chars, lower, nfd):
        cp = ord(c)
        if lo != c:
            data["lower"][cp] = [ord(x) for x in lo]
        if d != c and not 0xAC00 <= cp <= 0xD7A3:  # Hangul syllables: computed, not tabled
            data["nfd"][cp] = [ord(x) for x in d]
        ccc = unicodedata2.combining(c)
        if ccc:
            data["ccc"][cp] = ccc
    nfc = normalizers.NFC()
    for c in chars:
        dec = unicodedata2.decomposition(c)
        if not dec or dec.startswith("<") or 0xAC00 <= ord(c) <= 0xD7A3:
            continue
        parts = [int(x, 16) for x in dec.split()]
        if len(parts) == 2 and nfc.normalize_str(chr(parts[0]) + chr(parts[1])) == c:
            data["compose"].append((parts[0], parts[1], ord(c)))
    text = "".join(chars)
    values = {}
    for i, name in enumerate(GCB_VALUES[1:], start=1):
        for ch in regex.findall(r"\p{Grapheme_Cluster_Break=%s}" % name, text):
            values[ord(ch)] = i
    for ch in regex.findall(r"\p{Extended_Pictographic}", text):
        values[ord(ch)] = values.get(ord(ch), 0) | 16
    for name, v in INCB_VALUES.items():
        for ch in regex.findall(r"\p{InCB=%s}" % name, text):
            values[ord(ch)] = values.get(ord(ch), 0) | (v << 5)
    data["grapheme"] = values
    return data


def value_ranges(values):
    out = []
    for c in sorted(values):
        if out and out[-1][1] == c - 1 and out[-1][2] == values[c]:
            out[-1][1] = c
        else:
            out.append([c, c, values[c]])
    return out


def normalizer_tables(args):
    import regex
    import unicodedata2
    data = normalizer_data()
    out = [
        f"// GENERATED by tests/e2e/tokenizer_reference.py normalizer-tables (tokenizers "
        f"{tokenizers.__version__},\n// unicodedata2 (Unicode {unicodedata2.unidata_version}), regex "
        f"{regex.__version__}); do not edit. Lowercase and NFD as tokenizers'\n// normalizers "
        f"map each code point, canonical combining classes, the canonical compositions NFC\n"
        f"// applies, and grapheme cluster classes (see unicode_norm.h).\n",
        '#include "titan/components/tokenizer/unicode_norm.h"\n\nnamespace titan {\n'
        "namespace unicode_norm_tables {\n\n",
    ]

    def emit(decl, rows, size_name, count, per_row=4):
        lines = [", ".join(rows[i:i + per_row]) for i in range(0, len(rows), per_row)]
        out.append(decl + " = {\n" + "\n".join(f"    {r}," for r in lines) + "\n};\n")
        out.append(f"const size_t {size_name} = {count};\n\n")

    lower = sorted(data["lower"].items())
    assert max(len(v) for _, v in lower) <= 2
    emit("const LowercaseMapping kLowercase[]",
         [f"{{0x{c:X}, {{0x{v[0]:X}, 0x{(v + [0])[1]:X}}}}}" for c, v in lower],
         "kLowercase_size", len(lower), 3)
    nfd = sorted(data["nfd"].items())
    flat, rows = [], []
    for c, v in nfd:
        rows.append(f"{{0x{c:X}, {len(flat)}, {len(v)}}}")
        flat.extend(v)
    emit("const Decomposition kDecompositions[]", rows, "kDecompositions_size", len(rows))
    emit("const uint32_t kDecompositionChars[]", [f"0x{c:X}" for c in flat],
         "kDecompositionChars_size", len(flat), 8)
    ccc = value_ranges(data["ccc"])
    emit("const CodePointValueRange kCombiningClasses[]",
         [f"{{0x{a:X}, 0x{b:X}, {v}}}" for a, b, v in ccc], "kCombiningClasses_size", len(ccc))
    comp = sorted(data["compose"])
    emit("const Composition kCompositions[]", [f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}" for a, b, c in comp],
         "kCompositions_size", len(comp), 3)
    gr = value_ranges(data["grapheme"])
    emit("const CodePointValueRange kGraphemeClasses[]",
         [f"{{0x{a:X}, 0x{b:X}, {v}}}" for a, b, v in gr], "kGraphemeClasses_size", len(gr))
    out.append("}  // namespace unicode_norm_tables\n}  // namespace titan\n")
    text = "".join(out)
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            body = f.read()
        strip = lambda t: t.split("namespace unicode_norm_tables {", 1)[1]
        if strip(body) != strip(text):
            print(f"FAIL: {args.check} differs from the libraries' data; regenerate it with "
                  f"tests/e2e/tokenizer_reference.py normalizer-tables", file=sys.stderr)
            return 1
        print(f"{args.check}: Lowercase, NFD, NFC compositions and grapheme classes agree with "
              f"the libraries")
        return 0
    sys.stdout.write(text)
    return 0


def pre_tokenizer_cases(args):
    splitters = {
        name: pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
        for name, pattern in (("gpt2", GPT2_PATTERN), ("llama3", LLAMA3_PATTERN))
    }
    alphabet = [
        " ", " ", " ", "\n", "\n", "\r", "\t", "\u00a0", "\u3000", "\u2028", "\ufeff", "\u0085",
        "\u180e", "\x1c", "\x0b", "a", "b", "e", "r", "s", "t", "v", "l", "m", "d", "S", "T", "R",
        "E", "L", "D", "K", "\u212a", "\u00e9", "\u4e16", "\u0416", "0", "1", "9", "\u0663",
        "\u216b", "\u00bd", "'", "'", "\u2019", "\u017f", ".", ",", "!", "(", "-", "\U0001f642",
        "\u0301", "$", "\u200b", "\U00010d4a", "\U00010940",
    ]
    texts = [
        "Hello world", "I'm fine, you're not. They'll've", "DON'T 'S 'Re",
        "  leading  and trailing  ", "a\n\nb\r\n\r\nc \n d", "x   \n  y", "12345 678 9",
        "emoji \U0001f642\U0001f642 and \u4e16\u754c CJK", "\t\ttabs\t", "a.b!!c??", "''s 's's",
        "end with spaces   ", "   ", "\n", " \n ", "price: $1,234.56!",
        "nel\u0085 \u0085x \ufeffbom \ufeff y", "'\u017f '\u212a 'K",
        "1234567 \u0663\u0663\u0663\u0663",
    ]
    rng = random.Random(12345)
    for _ in range(400):
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))))
    cases = []
    for text in texts:
        case = {"text": text}
        for name, splitter in splitters.items():
            case[name] = [piece for piece, _ in splitter.pre_tokenize_str(text)]
        cases.append(json.dumps(case, ensure_ascii=False))
    sys.stdout.write("[" + ",\n".join(cases) + "]\n")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("gpt2_dir")
    p.add_argument("out_dir")
    p = sub.add_parser("prepare-t5-clip")
    p.add_argument("corpus")
    p.add_argument("out_dir")
    p = sub.add_parser("with-prefix-space")
    p.add_argument("input")
    p.add_argument("output")
    p = sub.add_parser("compare")
    p.add_argument("--titan", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--corpus")
    p.add_argument("--whole-corpus", action="store_true")
    p.add_argument("--adversarial", action="store_true")
    p.add_argument("--random", type=int, default=0)
    p.add_argument("--decode", action="store_true")
    p = sub.add_parser("unicode-tables")
    p.add_argument("--check")
    sub.add_parser("pre-tokenizer-cases")
    p = sub.add_parser("normalizer-tables")
    p.add_argument("--check")
    args = parser.parse_args()
    handlers = {"prepare": prepare, "prepare-t5-clip": prepare_t5_clip, "with-prefix-space": with_prefix_space, "compare": compare,
                "unicode-tables": unicode_tables, "pre-tokenizer-cases": pre_tokenizer_cases,
                "normalizer-tables": normalizer_tables}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
