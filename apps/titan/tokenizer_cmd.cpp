// `titan tokenizer`: encode or decode text with tokenizer files, one input line per output line,
// time encoding (MB/s), and train a byte-level BPE tokenizer.json from .txt files. Used by the end-to-end tests that compare our ids with reference
// encoders. Bad usage throws ConfigError (exit 2).
#include "commands.h"

#include "titan/common/check.h"
#include "titan/components/tokenizer/bpe_trainer.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <unistd.h>

namespace titan {
namespace {

constexpr const char* kUsage =
    "usage: titan tokenizer encode --tokenizer PATH [--input FILE] [--whole]\n"
    "       titan tokenizer decode --tokenizer PATH [--input FILE]\n"
    "       titan tokenizer bench  --tokenizer PATH --input FILE_OR_DIR\n"
    "       titan tokenizer train  --input PATH... --vocab-size N --output DIR\n"
    "\n"
    "PATH is a tokenizer.json, a tiktoken file (Llama 3's tokenizer.model), or a folder holding\n"
    "tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe or tokenizer.model.\n"
    "encode prints the token ids of each input line (space-separated, one line per line;\n"
    "--whole: the entire input as one text, on one line). decode reads such lines back.\n"
    "--input defaults to stdin. bench encodes every *.txt of a folder and prints MB/s.\n"
    "train learns a byte-level BPE (GPT-2 pre-tokenizer) from .txt files and folders (searched\n"
    "recursively); N counts 256 bytes, the merges and <|begin_of_text|>, <|end_of_text|>. It\n"
    "writes DIR/tokenizer.json (Hugging Face format).\n";

struct Options {
  std::string action;
  std::string tokenizer;
  std::string input;
  bool whole = false;
};

Options parse_options(const std::vector<std::string>& args) {
  Options opts;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw ConfigError(a + " needs a value\n" + kUsage);
      return args[++i];
    };
    if (a == "--tokenizer") {
      opts.tokenizer = value();
    } else if (a == "--input") {
      opts.input = value();
    } else if (a == "--whole") {
      opts.whole = true;
    } else if (opts.action.empty() && !a.empty() && a[0] != '-') {
      opts.action = a;
    } else {
      throw ConfigError("unknown argument '" + a + "'\n" + kUsage);
    }
  }
  if (opts.action != "encode" && opts.action != "decode" && opts.action != "bench") {
    throw ConfigError((opts.action.empty() ? std::string("missing action")
                                           : "unknown action '" + opts.action + "'") +
                      " (want encode, decode, bench or train)\n" + kUsage);
  }
  if (opts.tokenizer.empty()) throw ConfigError(std::string("--tokenizer is required\n") + kUsage);
  if (opts.action == "bench" && opts.input.empty()) {
    throw ConfigError(std::string("bench needs --input\n") + kUsage);
  }
  return opts;
}

std::string read_all(const std::string& path) {
  std::ostringstream buf;
  if (path.empty() || path == "-") {
    buf << std::cin.rdbuf();
    return buf.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("--input " + path + ": cannot open the file");
  buf << in.rdbuf();
  return buf.str();
}

// Lines of `text` without their '\n'; a final line without '\n' counts, an empty text has none.
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

void print_ids(const std::vector<int64_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line.push_back(' ');
    line += std::to_string(ids[i]);
  }
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
}

std::vector<int64_t> parse_ids(std::string_view line, size_t line_no) {
  std::vector<int64_t> ids;
  std::istringstream fields{std::string(line)};
  std::string field;
  while (fields >> field) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(field, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != field.size()) {
      throw DataError("input line " + std::to_string(line_no) + ": '" + field +
                      "' is not a token id");
    }
    ids.push_back(id);
  }
  return ids;
}

int bench(const Tokenizer& tok, const std::string& input) {
  std::vector<std::string> docs;
  namespace fs = std::filesystem;
  if (fs::is_directory(input)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(input)) {
      if (entry.path().extension() == ".txt") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) docs.push_back(read_all(f.string()));
  } else {
    docs.push_back(read_all(input));
  }
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  for (int pass = 0; pass < 2; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    size_t tokens = 0;
    for (const auto& d : docs) tokens += tok.encode(d).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %zu docs, %.2f MB, %zu tokens (%.2f bytes/token), %.3f s, %.1f MB/s\n",
                pass == 0 ? "encode (cold cache)" : "encode (warm cache)", docs.size(),
                bytes / 1e6, tokens, static_cast<double>(bytes) / std::max<size_t>(tokens, 1), s,
                bytes / 1e6 / s);
  }
  return 0;
}

int64_t parse_vocab_size(const std::string& text) {
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw ConfigError("--vocab-size expects an integer, got '" + text + "'");
  }
  return n;
}

int train(const std::vector<std::string>& args) {
  std::vector<std::string> inputs;
  std::string output;
  BpeTrainerOptions options;
  options.vocab_size = -1;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw ConfigError(a + " needs a value\n" + kUsage);
      return args[++i];
    };
    if (a == "--input") {
      inputs.push_back(value());
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) inputs.push_back(args[++i]);
    } else if (a == "--vocab-size") {
      options.vocab_size = parse_vocab_size(value());
    } else if (a == "--output") {
      output = value();
    } else {
      throw ConfigError("unknown argument '" + a + "'\n" + kUsage);
    }
  }
  if (options.vocab_size < 0) throw ConfigError(std::string("train needs --vocab-size\n") + kUsage);
  if (output.empty()) throw ConfigError(std::string("train needs --output\n") + kUsage);
  const std::vector<std::string> files = list_training_files(inputs);
  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  BpeTrainer trainer;
  size_t bytes = 0;
  for (const std::string& f : files) {
    const std::string text = read_all(f);
    bytes += text.size();
    trainer.add_text(text);
  }
  std::fprintf(stderr, "read %zu files, %.2f MB, %zu unique pre-tokens in %.2f s\n", files.size(),
               bytes / 1e6, trainer.num_unique_words(), seconds());
  const bool tty = ::isatty(::fileno(stderr));
  double last_report = seconds();
  const BpeTrainResult result = trainer.train(options, [&](int64_t done, int64_t total) {
    const double now = seconds();
    if (now - last_report < 1.0 && done < total) return;
    last_report = now;
    std::fprintf(stderr, "merges %lld / %lld (%.1f s)%s", static_cast<long long>(done),
                 static_cast<long long>(total), now, tty ? "\r" : "\n");
  });
  if (tty) std::fputc('\n', stderr);
  write_bpe_tokenizer_json(result, output);
  std::printf("trained %zu merges, vocab %zu in %.2f s -> %s/tokenizer.json\n",
              result.merges.size(), result.tokens.size() + result.special_tokens.size(),
              seconds(), output.c_str());
  return 0;
}

}  // namespace

int run_tokenizer(const std::vector<std::string>& args) {
  if (std::any_of(args.begin(), args.end(),
                  [](const std::string& a) { return a == "--help" || a == "-h"; })) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.empty() && args[0] == "train") return train(args);
  const Options opts = parse_options(args);
  const std::unique_ptr<Tokenizer> tok = build_tokenizer(opts.tokenizer);
  if (opts.action == "bench") return bench(*tok, opts.input);
  const std::string text = read_all(opts.input);
  if (opts.action == "encode") {
    if (opts.whole) {
      print_ids(tok->encode(text));
    } else {
      for (std::string_view line : split_lines(text)) print_ids(tok->encode(line));
    }
    return 0;
  }
  size_t line_no = 0;
  for (std::string_view line : split_lines(text)) {
    const std::string decoded = tok->decode(parse_ids(line, ++line_no));
    std::fwrite(decoded.data(), 1, decoded.size(), stdout);
    std::fputc('\n', stdout);
  }
  return 0;
}

}  // namespace titan
