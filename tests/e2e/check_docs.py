"""Checks the project's Markdown (README.md and docs/*.md) against the tree and the binary.

usage: check_docs.py [--helps FILE] [--root DIR] path/to/titan [FILE.md ...]
       DIR: the repository root (default: the current folder); FILEs: default README.md and
       every .md under docs/, relative to DIR; --helps: a JSON file of the binary's help texts,
       read when it exists and written back, so that a second run asks the binary less

What it checks, each failure printed as FILE:LINE: what is wrong (and the nearest right name):
  links     every relative link [text](target) names a file or folder that exists inside the
            repository; a #anchor names a heading of the target page (GitHub's slug of it).
  paths     every repository path written in inline code (`src/...`, `tests/...`, `scripts/...`,
            `bench/...`, `configs/...`, `apps/...`, `cmake/...`, `docs/...`) exists.
  commands  every titan invocation in a code block or inline code (`titan X`, `build/titan X`,
            `"$TITAN" X`, `titan run ... -- X ...`, `torchrun ... build/titan X`) names a
            subcommand the binary has, an action its usage lists (`titan convert to-hf`), and
            flags its `titan X --help` lists; `--section.key` flags only where X takes a config.
            A flag on its own in inline code (`--no_kv_cache`) must be a flag of some titan
            subcommand, appear in the repository's scripts/ or bench/ sources or in a command of
            the docs' code blocks (other programs: srun, torchrun, ...), or be in OTHER_FLAGS.
  config    every `--section.key` anywhere in the text, and every `section.key` in inline code
            whose section is a config section, is a key (or section) of `titan train --help`.
Standard library only; the binary is asked for its help texts, in parallel, nothing else.
"""

import concurrent.futures
import difflib
import json
import os
import re
import subprocess
import sys

CODE_LANGS_SKIPPED = {"json", "toml", "python", "py", "js", "javascript", "csv", "text"}
PATH_ROOTS = ("src", "tests", "scripts", "bench", "configs", "apps", "cmake", "docs")
FILE_SUFFIXES = {"json", "jsonl", "safetensors", "toml", "txt", "bin", "md", "py", "sh", "h",
                 "cpp", "svg", "model", "pickle", "bpe", "index"}
SEPARATORS = {"|", "||", "&&", ";", "&"}
# Flags of other programs that the docs name only in prose.
OTHER_FLAGS = {"--gpus-per-task"}  # SLURM's: what a GPU job must not set (docs/gpus.md)


def slug(heading):
    """GitHub's anchor of a heading: its rendered text lowercased, punctuation dropped, spaces
    turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


class Page:
    """One Markdown file split into what the checks read: headings, prose (code spans blanked,
    for links), inline code spans and code-block lines, each with its line number."""

    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.anchors = set()
        self.block_lines = []  # (line number, text) of fenced code blocks
        self.paragraphs = []  # (first line number, text joined with \n)
        seen = {}
        fence = None
        para, para_start = [], 0
        for n, line in enumerate(self.lines, 1):
            stripped = line.lstrip()
            marker = re.match(r"(`{3,}|~{3,})\s*([\w+-]*)", stripped)
            if fence is not None:
                if marker and marker.group(1)[0] == fence[0][0] and \
                        len(marker.group(1)) >= len(fence[0]) and not marker.group(2):
                    fence = None
                elif fence[1] not in CODE_LANGS_SKIPPED:
                    self.block_lines.append((n, line))
                continue
            if marker:
                fence = (marker.group(1), marker.group(2).lower())
                if para:
                    self.paragraphs.append((para_start, "\n".join(para)))
                    para = []
                continue
            heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if heading:
                base = slug(heading.group(1))
                count = seen.get(base, 0)
                seen[base] = count + 1
                self.anchors.add(base if count == 0 else f"{base}-{count}")
            if not line.strip():
                if para:
                    self.paragraphs.append((para_start, "\n".join(para)))
                    para = []
                continue
            if not para:
                para_start = n
            para.append(line)
        if para:
            self.paragraphs.append((para_start, "\n".join(para)))

    def code_spans(self):
        """(line number, text) of every inline code span outside code blocks."""
        for start, text in self.paragraphs:
            for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, re.S):
                yield start + text.count("\n", 0, m.start()), m.group(2).strip()

    def prose(self):
        """(line number, text) of each paragraph with its code spans blanked out."""
        for start, text in self.paragraphs:
            blanked = re.sub(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)",
                             lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
            yield start, blanked


class Titan:
    """What the binary says about itself: subcommands, their flags and actions, config keys."""

    def __init__(self, binary, names, cache=None):
        self.binary = binary
        helps = {}
        if cache and os.path.exists(cache):
            with open(cache, encoding="utf-8") as f:
                helps = {k: tuple(v) for k, v in json.load(f).items()}
        wanted = sorted((set(names) | {"", "train"}) - set(helps))
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            helps.update(zip(wanted, pool.map(self._help, wanted)))
        if cache:
            with open(cache, "w", encoding="utf-8") as f:
                json.dump(helps, f)
        self.listed = {}
        for m in re.finditer(r"^  ([a-z][a-z0-9-]*)\s+(.*)$", helps[""][1], re.M):
            self.listed[m.group(1)] = m.group(2)
        # A name is a command when the top-level help lists it, or when `titan X --help`
        # succeeds with a help of its own (titan selftest's). A name the binary does not know
        # fails ("unknown command"), or, in builds before that check, prints the generic
        # config help with the name in its usage line.
        self.helps = {}
        for name, (rc, text) in helps.items():
            generic = text.startswith(f"usage: titan {name} [--job.config_file FILE] "
                                      "[--section.key value ...]\n")
            unknown = rc != 0 or "unknown command" in text or generic
            if name and (name in self.listed or not unknown):
                self.helps[name] = text + "\n" + self.listed.get(name, "")
        self.keys, self.sections = set(), set()
        for m in re.finditer(r"^\s+--([a-z0-9_.]+) <", helps["train"][1], re.M):
            self.keys.add(m.group(1))
        for m in re.finditer(r"^\[([a-z0-9_.]+)\]$", helps["train"][1], re.M):
            self.sections.add(m.group(1))
        if not self.keys:
            sys.exit(f"check_docs: `{binary} train --help` lists no --section.key flags")
        self.top_sections = {s.split(".")[0] for s in self.sections}

    def _help(self, name):
        args = [self.binary] + ([name] if name else []) + ["--help"]
        try:
            r = subprocess.run(args, capture_output=True, text=True, timeout=60)
        except OSError as e:
            sys.exit(f"check_docs: cannot run {self.binary}: {e}")
        return r.returncode, r.stdout + r.stderr

    def is_command(self, name):
        return name in self.helps

    def flags(self, name):
        return set(re.findall(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)(?![\w.-])",
                              self.helps[name]))

    def actions(self, name):
        return set(re.findall(rf"titan {re.escape(name)} +([a-z][a-z0-9-]*)", self.helps[name]))

    def takes_config(self, name):
        return "--section.key" in self.helps[name]


def nearest(word, choices):
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" (nearest: {close[0]})" if close else ""


def shell_words(lines):
    """Tokens of shell text, as (line number, token): continuation lines joined, comments
    dropped, separators kept as their own tokens, quotes and usage brackets stripped."""
    out = []
    for n, line in lines:
        for raw in line.split():
            if raw.startswith("#"):
                break
            if raw == "\\":
                continue
            if raw in SEPARATORS:
                out.append((n, raw))
                continue
            tail_sep = raw.endswith(";")
            token = raw.rstrip(";").strip("\"'[](){}").rstrip(",")
            if token:
                out.append((n, token))
            if tail_sep:
                out.append((n, ";"))
        if not line.rstrip().endswith("\\"):
            out.append((n, "\n"))
    return out


def is_titan(token):
    return bool(re.fullmatch(r"(?:[\w.-]*/)*titan|\$\{?TITAN\}?", token))


def commands(words):
    """Every titan invocation in a token list, as its words after `titan`: [(line, word), ...],
    the first the subcommand. `titan` followed by something else (a number, a path) is an
    argument of another program, not an invocation."""
    found = []
    i = 0
    while i < len(words):
        if not is_titan(words[i][1]):
            i += 1
            continue
        j = i + 1
        args = []
        while j < len(words) and words[j][1] not in SEPARATORS and words[j][1] != "\n":
            args.append(words[j])
            j += 1
        if args and re.fullmatch(r"[a-z][a-z0-9-]*", args[0][1]):
            found.append(args)
        i = j
    return found


class Checker:
    """The checks over a set of pages, run from the repository root."""

    def __init__(self, pages, binary, cache=None):
        self.pages = {os.path.normpath(p): Page(p) for p in pages}
        self.problems = []
        self.invocations = []  # (file, args)
        for path, page in self.pages.items():
            block_words = shell_words(page.block_lines)
            for args in commands(block_words):
                self.invocations.append((path, args))
            for n, span in page.code_spans():
                for args in commands(shell_words([(n, span)])):
                    self.invocations.append((path, args))
        names = set()
        for _, args in self.invocations:
            names.add(args[0][1])
            if args[0][1] == "run":
                for k, (_, t) in enumerate(args):
                    if t == "--" and k + 1 < len(args):
                        names.add(args[k + 1][1])
        self.titan = Titan(binary, names, cache)

    def report(self, path, line, message):
        self.problems.append((path, line, message))

    # -- links and paths ---------------------------------------------------------------------
    def check_links(self):
        for path, page in self.pages.items():
            here = os.path.dirname(path)
            for start, text in page.prose():
                targets = [(m.start(), m.group(1)) for m in
                           re.finditer(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)]
                targets += [(m.start(), m.group(1)) for m in
                            re.finditer(r"^\s*\[[^\]]+\]:\s*(\S+)", text, re.M)]
                for offset, target in targets:
                    self.check_link(path, here, start + text.count("\n", 0, offset), target)

    def check_link(self, path, here, line, target):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            return  # an absolute URL
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(here, file_part)) if file_part else path
        if resolved == ".." or resolved.startswith(".." + os.sep) or os.path.isabs(resolved):
            self.report(path, line, f"link '{target}' leaves the repository")
            return
        if not os.path.exists(resolved):
            self.report(path, line, f"link '{target}': {resolved} does not exist")
            return
        if not anchor or not resolved.endswith(".md"):
            return
        page = self.pages.get(resolved) or Page(resolved)
        if anchor not in page.anchors:
            self.report(path, line, f"link '{target}': no heading of {resolved} has the anchor "
                        f"'#{anchor}'{nearest(anchor, page.anchors)}")

    def check_paths(self):
        pattern = re.compile(rf"(?<![\w./-])((?:{'|'.join(PATH_ROOTS)})/[\w./+-]*)")
        for path, page in self.pages.items():
            for n, span in page.code_spans():
                for m in pattern.finditer(span):
                    p = m.group(1).rstrip(".,")
                    rest = span[m.end():m.end() + 1]
                    if rest and rest in "<*{$":
                        continue  # a pattern such as tests/fuzz/fuzz_<parser>.cpp
                    if not os.path.exists(p):
                        self.report(path, n, f"`{p}` does not exist in the repository")

    # -- titan commands and config keys -------------------------------------------------------
    def check_invocations(self):
        for path, args in self.invocations:
            self.check_command(path, args)

    def check_command(self, path, args):
        line, name = args[0]
        if not self.titan.is_command(name):
            self.report(path, line, f"`titan {name}`: no such subcommand"
                        f"{nearest(name, self.titan.helps)}")
            return
        rest = args[1:]
        actions = self.titan.actions(name)
        if actions and rest and re.fullmatch(r"[a-z][a-z0-9|-]*", rest[0][1]):
            for action in rest[0][1].split("|"):
                if action not in actions:
                    self.report(path, rest[0][0], f"`titan {name} {action}`: no such action "
                                f"(titan {name} --help lists {', '.join(sorted(actions))})")
        flags = self.titan.flags(name)
        for k, (n, token) in enumerate(rest):
            if token == "--" and name == "run":
                inner = rest[k + 1:]
                if inner and self.titan.is_command(inner[0][1]):
                    self.check_command(path, inner)
                return
            m = re.match(r"--([A-Za-z0-9][A-Za-z0-9_.-]*)", token)
            if not m:
                continue
            flag = m.group(1)
            if "." in flag:
                if not self.titan.takes_config(name):
                    self.report(path, n, f"`titan {name}` takes no config override such as "
                                f"--{flag}")
                continue  # the key itself: check_config_keys
            if "--" + flag not in flags:
                self.report(path, n, f"`titan {name}` has no flag --{flag}"
                            f"{nearest('--' + flag, flags)}")

    def check_lone_flags(self):
        known = set(OTHER_FLAGS)
        for name in self.titan.helps:
            known |= self.titan.flags(name)
        for folder in ("scripts", "bench"):
            for d, _, files in os.walk(folder):
                for f in files:
                    with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
                        known |= set(re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", fh.read()))
        for page in self.pages.values():
            for _, line in page.block_lines:
                known |= set(re.findall(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*",
                                        line.split(" #")[0]))
        for path, page in self.pages.items():
            for n, span in page.code_spans():
                m = re.fullmatch(r"(--[A-Za-z0-9][A-Za-z0-9_-]*)(?:[= ].*)?", span, re.S)
                if m and m.group(1) not in known:
                    self.report(path, n, f"{m.group(1)} is not a flag of any titan subcommand "
                                f"nor of the scripts{nearest(m.group(1), known)}")

    def check_config_keys(self):
        keys, sections = self.titan.keys, self.titan.sections
        for path, page in self.pages.items():
            for n, line in enumerate(page.lines, 1):
                for m in re.finditer(r"(?<![\w-])--([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)+)", line):
                    if m.group(1) not in keys and m.group(1) != "section.key":
                        self.report(path, n, f"--{m.group(1)} is not a config key"
                                    f"{nearest(m.group(1), keys)}")
            tops = "|".join(sorted(self.titan.top_sections))
            bare = re.compile(rf"(?<![\w./<>-])((?:{tops})(?:\.[a-z0-9_]+)+)(?![\w(/-])")
            for n, span in page.code_spans():
                for m in bare.finditer(span):
                    name = m.group(1)
                    if span[max(0, m.start() - 2):m.start()] == "--":
                        continue  # checked above
                    if name.rsplit(".", 1)[1] in FILE_SUFFIXES:
                        continue  # a file name such as metrics.jsonl
                    if "section.key" in name or span[m.end():m.end() + 2] == ".*":
                        continue  # the placeholder, or a pattern such as [quantize.grouped_mm.*]
                    if name not in keys and name not in sections:
                        self.report(path, n, f"`{name}` is not a config key"
                                    f"{nearest(name, keys | sections)}")

    def run(self):
        self.check_links()
        self.check_paths()
        self.check_invocations()
        self.check_lone_flags()
        self.check_config_keys()
        for path, line, message in sorted(set(self.problems)):
            print(f"{path}:{line}: {message}")
        return len(set(self.problems))


def main():
    args = sys.argv[1:]
    cache = None
    if len(args) >= 2 and args[0] == "--helps":
        cache = os.path.abspath(args[1])
        args = args[2:]
    if not args or (args[0] == "--root" and len(args) < 3):
        sys.exit(__doc__)
    if args[0] == "--root":
        if "/" in args[2]:
            args[2] = os.path.abspath(args[2])  # the binary, relative to where we started
        os.chdir(args[1])
        args = args[2:]
    binary = args[0]
    pages = args[1:]
    if not pages:
        pages = ["README.md"] + sorted(
            os.path.join(d, f) for d, _, fs in os.walk("docs") for f in fs if f.endswith(".md"))
    checker = Checker(pages, binary, cache)
    problems = checker.run()
    print(f"check_docs: {len(pages)} pages, {len(checker.invocations)} titan invocations, "
          f"{len(checker.titan.keys)} config keys: {problems} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
