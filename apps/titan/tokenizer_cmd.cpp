// `titan tokenizer`: encode or decode text with tokenizer files, one input line per output line
// (used by the end-to-end tests that compare our ids with reference encoders); time encoding in
// MB/s on one thread and several; train a byte-level BPE tokenizer.json from .txt files or from a
// registered dataset; render conversations with a model's chat template. Bad usage throws
// ConfigError (exit 2).
#include "commands.h"
#include "flags.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/components/data/dataset.h"
#include "titan/components/data/document_source.h"
#include "titan/components/tokenizer/bpe_trainer.h"
#include "titan/components/tokenizer/chat_config.h"
#include "titan/components/tokenizer/chat_template.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace titan {
namespace {

constexpr const char* kPaths =
    "PATH is a tokenizer.json, a tiktoken file (Llama 3's tokenizer.model), or a folder holding\n"
    "tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe or tokenizer.model.";

struct TokenizerOptions {
  std::string tokenizer;
  std::string input;
  bool whole = false;
  int threads = 1;  // bench: also time this many threads (0: all cores)
};

// A non-negative integer argument of `flag`; ConfigError otherwise.
int64_t parse_count(const std::string& flag, const std::string& text) {
  const std::optional<int64_t> n = parse_int64(text);
  TITAN_CONFIG_CHECK(n && *n >= 0, flag, " expects a non-negative integer, got '", text, "'");
  return *n;
}

// The flags of encode, decode and bench (`action`), which all read text with a tokenizer.
FlagTable text_flags(const std::string& action, TokenizerOptions& o) {
  const bool bench = action == "bench";
  FlagTable flags(
      action == "encode"   ? "titan tokenizer encode --tokenizer PATH [--input FILE] [--whole]"
      : action == "decode" ? "titan tokenizer decode --tokenizer PATH [--input FILE]"
                           : "titan tokenizer bench --tokenizer PATH --input FILE_OR_DIR "
                             "[--threads N]",
      action == "encode"   ? "Prints the token ids of each input line (space-separated, one line "
                             "per line)."
      : action == "decode" ? "Reads lines of token ids (as encode prints them) and prints their "
                             "text."
                           : "Encodes every *.txt of a folder (one document each) and prints MB/s "
                             "on one\nthread, then on N threads encoding documents in parallel.");
  flags.value("--tokenizer", "PATH", "the tokenizer files (see PATH below)",
              [&o](const std::string& v) { o.tokenizer = v; });
  flags.value("--input", bench ? "FILE_OR_DIR" : "FILE",
              bench ? "a text file, or a folder of *.txt documents" : "the text (default stdin)",
              [&o](const std::string& v) { o.input = v; });
  if (action == "encode") {
    flags.toggle("--whole", "the entire input as one text, on one line", &o.whole);
  }
  if (bench) {
    flags.value("--threads", "N", "also time N threads (0: all cores; default 1: only one)",
                [&o](const std::string& v) {
                  const int64_t n = parse_count("--threads", v);
                  o.threads =
                      n == 0 ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                             : static_cast<int>(std::min<int64_t>(n, 1024));
                });
  }
  return flags;
}

struct TrainArgs {
  std::vector<std::string> inputs;  // .txt files and folders, or
  std::string dataset;              // a registered dataset (e.g. sotu), read as the trainer does
  std::string dataset_path;         // its location; empty: the dataset's default
  std::string text_field = "text";  // JSON key, for jsonl datasets
  std::string output;
  BpeTrainerOptions options;
};

FlagTable train_flags(TrainArgs& t) {
  FlagTable flags(
      "titan tokenizer train (--input PATH... | --dataset NAME) --vocab-size N --output DIR",
      "Learns a byte-level BPE (GPT-2 pre-tokenizer) from .txt files and folders (searched\n"
      "recursively) or from the documents of a dataset as training reads it. It writes\n"
      "DIR/tokenizer.json (Hugging Face format). Training is deterministic.");
  flags
      .values("--input", "PATH", "text files and folders",
              [&t](const std::string& v) { t.inputs.push_back(v); })
      .value("--dataset", "NAME",
             "a training.dataset (e.g. sotu: its training split), instead of --input",
             [&t](const std::string& v) { t.dataset = v; })
      .value("--dataset-path", "PATH", "the dataset's files, as training.dataset_path",
             [&t](const std::string& v) { t.dataset_path = v; })
      .value("--text-field", "KEY", "JSON key of a document's text (default \"text\")",
             [&t](const std::string& v) { t.text_field = v; })
      .value("--vocab-size", "N",
             "the vocabulary: 256 bytes, the merges and <|begin_of_text|>, <|end_of_text|>",
             [&t](const std::string& v) { t.options.vocab_size = parse_count("--vocab-size", v); })
      .value("--output", "DIR", "the folder to write tokenizer.json into",
             [&t](const std::string& v) { t.output = v; });
  return flags;
}

// The options of encode, decode or bench: args[0] is the action.
TokenizerOptions parse_tokenizer_options(const std::string& action,
                                         const std::vector<std::string>& args) {
  TokenizerOptions opts;
  const FlagTable flags = text_flags(action, opts);
  flags.parse_exact(std::vector<std::string>(args.begin() + 1, args.end()));
  TITAN_CONFIG_CHECK(!opts.tokenizer.empty(), "--tokenizer is required\n", flags.usage());
  TITAN_CONFIG_CHECK(action != "bench" || !opts.input.empty(), "bench needs --input\n",
                     flags.usage());
  return opts;
}

std::string read_all(const std::string& path) {
  std::ostringstream buf;
  if (path.empty() || path == "-") {
    buf << std::cin.rdbuf();
    return buf.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(message("--input ", path, ": cannot open the file"));
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
  const std::string line = join(ids, " ") + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
}

std::vector<int64_t> parse_token_ids(std::string_view line, size_t line_no) {
  std::string bad;
  const auto ids = parse_int_list(std::string(line), &bad);
  if (!ids) {
    throw DataError("input line " + std::to_string(line_no) + ": '" + bad + "' is not a token id");
  }
  return *ids;
}

// Encodes every document with `threads` std::threads that take documents from a shared counter;
// returns the total number of tokens. The first exception of any thread is rethrown.
size_t encode_all(const Tokenizer& tok, const std::vector<std::string>& docs, int threads) {
  std::atomic<size_t> next{0};
  std::atomic<size_t> tokens{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    try {
      size_t mine = 0;
      for (size_t i = next++; i < docs.size(); i = next++) mine += tok.encode(docs[i]).size();
      tokens += mine;
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return tokens;
}

std::vector<std::string> read_documents(const std::string& input) {
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
  return docs;
}

// Times encoding one thread, then `threads` threads, each with a fresh tokenizer (cold per-piece
// cache: the first pass over a corpus) and again (warm cache).
int bench(const TokenizerOptions& opts) {
  const std::vector<std::string> docs = read_documents(opts.input);
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::vector<int> thread_counts{1};
  if (opts.threads != 1) thread_counts.push_back(opts.threads);
  for (const int threads : thread_counts) {
    const std::unique_ptr<Tokenizer> tok = build_tokenizer(opts.tokenizer);
    for (const char* cache : {"cold", "warm"}) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::clock_t cpu0 = std::clock();
      const size_t tokens = encode_all(*tok, docs, threads);
      const double cpu = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // CPU seconds (all threads) tell a busy machine from a slow tokenizer.
      std::printf(
          "encode, %d thread%s, %s cache: %zu docs, %.2f MB, %zu tokens "
          "(%.2f bytes/token), %.3f s (cpu %.3f s), %.1f MB/s\n",
          threads, threads == 1 ? "" : "s", cache, docs.size(), bytes / 1e6, tokens,
          static_cast<double>(bytes) / std::max<size_t>(tokens, 1), s, cpu, bytes / 1e6 / s);
      std::fflush(stdout);
    }
  }
  return 0;
}

// args[0] is "train".
TrainArgs parse_train_args(const std::vector<std::string>& args) {
  TrainArgs t;
  t.options.vocab_size = -1;
  const FlagTable flags = train_flags(t);
  flags.parse_exact(std::vector<std::string>(args.begin() + 1, args.end()));
  const std::string usage = flags.usage();
  TITAN_CONFIG_CHECK(t.inputs.empty() != t.dataset.empty(),
                     "train needs either --input PATH... or --dataset NAME\n", usage);
  TITAN_CONFIG_CHECK(t.dataset_path.empty() || !t.dataset.empty(),
                     "--dataset-path needs --dataset\n", usage);
  TITAN_CONFIG_CHECK(t.options.vocab_size >= 0, "train needs --vocab-size\n", usage);
  TITAN_CONFIG_CHECK(!t.output.empty(), "train needs --output\n", usage);
  return t;
}

// Adds the training text to `trainer`: the --input files, or the documents of --dataset through
// the registry the training loop reads (so `--dataset sotu` is exactly the training split).
// Returns a one-line description of what was read.
std::string add_training_text(const TrainArgs& t, BpeTrainer* trainer) {
  size_t bytes = 0;
  size_t count = 0;
  std::string what;
  if (!t.dataset.empty()) {
    std::string path = t.dataset_path;
    if (path.empty()) {
      try {
        path = default_dataset_path(t.dataset);
      } catch (const ConfigError& e) {
        throw ConfigError(message(e.what(), "; here: --dataset-path PATH"));
      }
    }
    const std::shared_ptr<const DocumentSource> source =
        open_dataset(t.dataset, path, t.text_field);
    for (int64_t i = 0; i < source->size(); ++i) {
      const std::string text = source->text(i);
      bytes += text.size();
      trainer->add_text(text);
    }
    count = static_cast<size_t>(source->size());
    what = "documents of dataset '" + t.dataset + "'";
  } else {
    for (const std::string& f : list_training_files(t.inputs)) {
      const std::string text = read_all(f);
      bytes += text.size();
      trainer->add_text(text);
      ++count;
    }
    what = "files";
  }
  char megabytes[32];
  std::snprintf(megabytes, sizeof(megabytes), "%.2f MB", bytes / 1e6);
  return "read " + std::to_string(count) + " " + what + ", " + megabytes + ", " +
         std::to_string(trainer->num_unique_words()) + " unique pre-tokens";
}

int train(const std::vector<std::string>& args) {
  const TrainArgs t = parse_train_args(args);
  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  BpeTrainer trainer;
  const std::string summary = add_training_text(t, &trainer);
  std::fprintf(stderr, "%s in %.2f s\n", summary.c_str(), seconds());
  const bool tty = ::isatty(::fileno(stderr));
  double last_report = seconds();
  const BpeTrainResult result = trainer.train(t.options, [&](int64_t done, int64_t total) {
    const double now = seconds();
    if (now - last_report < 1.0 && done < total) return;
    last_report = now;
    std::fprintf(stderr, "merges %lld / %lld (%.1f s)%s", static_cast<long long>(done),
                 static_cast<long long>(total), now, tty ? "\r" : "\n");
  });
  if (tty) std::fputc('\n', stderr);
  const auto vocab = static_cast<int64_t>(result.tokens.size() + result.special_tokens.size());
  if (vocab < t.options.vocab_size) {
    // Not an error (the tokenizer is complete for this text), but never a silent shortfall.
    std::fprintf(stderr,
                 "note: the training text allows only %zu merges: vocab %lld of the %lld asked "
                 "for (--vocab-size); every adjacent pair inside its words is merged already. "
                 "HINT: more (or more varied) text gives a larger vocabulary\n",
                 result.merges.size(), static_cast<long long>(vocab),
                 static_cast<long long>(t.options.vocab_size));
  }
  write_bpe_tokenizer_json(result, t.output);
  std::printf("trained %zu merges, vocab %zu in %.2f s -> %s/tokenizer.json\n",
              result.merges.size(), result.tokens.size() + result.special_tokens.size(), seconds(),
              t.output.c_str());
  return 0;
}

struct ChatArgs {
  std::string tokenizer;
  std::string input;
  bool add_generation_prompt = false;
};

FlagTable chat_flags(ChatArgs& c) {
  FlagTable flags(
      "titan tokenizer apply-chat-template --tokenizer PATH [--input FILE.jsonl] "
      "[--add-generation-prompt]",
      "Renders each conversation of the input with the chat template of the Hugging Face\n"
      "tokenizer files at PATH, as transformers' apply_chat_template(..., tokenize=False) does,\n"
      "and prints each rendering as one JSON string per line. An input line is\n"
      "{\"messages\": [...]} (with \"tools\" and \"documents\" when the template reads them) or the\n"
      "list of messages itself.");
  flags
      .value("--tokenizer", "PATH",
             "a tokenizer folder with chat_template.jinja or tokenizer_config.json's\n"
             "\"chat_template\" (its bos/eos/unk/pad tokens are passed too)",
             [&c](const std::string& v) { c.tokenizer = v; })
      .value("--input", "FILE", "the conversations, one per line (default stdin)",
             [&c](const std::string& v) { c.input = v; })
      .toggle("--add-generation-prompt", "end each rendering with the assistant's header",
              &c.add_generation_prompt);
  return flags;
}

// args[0] is "apply-chat-template".
int apply_chat(const std::vector<std::string>& args) {
  ChatArgs c;
  const FlagTable flags = chat_flags(c);
  flags.parse_exact(std::vector<std::string>(args.begin() + 1, args.end()));
  TITAN_CONFIG_CHECK(!c.tokenizer.empty(), "--tokenizer is required\n", flags.usage());
  const ChatTemplateFiles files = read_chat_template_files(c.tokenizer);
  const ChatTemplate chat_template(files.source, files.origin);
  ChatTemplateOptions options;
  options.special_tokens = files.special_tokens;
  options.add_generation_prompt = c.add_generation_prompt;
  const std::string text = read_all(c.input);
  const std::string where = c.input.empty() || c.input == "-" ? "stdin" : c.input;
  size_t line_no = 0;
  for (std::string_view line : split_lines(text)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string at = message(where, ":", line_no);
    nlohmann::ordered_json row;
    try {
      row = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(message(at, ": not valid JSON (", e.what(), ")"));
    }
    ChatTemplateOptions line_options = options;
    nlohmann::ordered_json messages = row;
    if (row.is_object()) {
      if (!row.contains("messages")) {
        throw DataError(message(at, ": no \"messages\" (want {\"messages\": [...]} or a list)"));
      }
      messages = row["messages"];
      if (row.contains("tools")) line_options.tools = row["tools"];
      if (row.contains("documents")) line_options.documents = row["documents"];
    }
    if (!messages.is_array()) {
      throw DataError(message(at, ": the messages are ", messages.type_name(), ", not a list"));
    }
    std::string rendered;
    try {
      rendered = apply_chat_template(chat_template, messages, line_options);
    } catch (const DataError& e) {
      throw DataError(message(at, ": ", e.what()));
    } catch (const ConfigError& e) {
      throw ConfigError(message(at, ": ", e.what()));
    }
    const std::string out = nlohmann::json(rendered).dump() + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return 0;
}

// Every action's table (what --help prints and the actions a command line may name).
std::vector<FlagTable> tokenizer_actions(TokenizerOptions& o, TrainArgs& t, ChatArgs& c) {
  return {text_flags("encode", o), text_flags("decode", o), text_flags("bench", o), train_flags(t),
          chat_flags(c)};
}

}  // namespace

int run_tokenizer(const std::vector<std::string>& args) {
  TokenizerOptions unused_options;
  TrainArgs unused_train;
  ChatArgs unused_chat;
  const std::vector<FlagTable> actions =
      tokenizer_actions(unused_options, unused_train, unused_chat);
  if (FlagTable::wants_help(args)) {
    std::fputs((actions_usage(actions) + "\n" + kPaths + "\n").c_str(), stdout);
    return 0;
  }
  const std::string action = choose_action(args, actions);
  if (action == "train") return train(args);
  if (action == "apply-chat-template") return apply_chat(args);
  const TokenizerOptions opts = parse_tokenizer_options(action, args);
  if (action == "bench") return bench(opts);
  const std::unique_ptr<Tokenizer> tok = build_tokenizer(opts.tokenizer);
  const std::string text = read_all(opts.input);
  if (action == "encode") {
    if (opts.whole) {
      print_ids(tok->encode(text));
    } else {
      for (std::string_view line : split_lines(text)) print_ids(tok->encode(line));
    }
    return 0;
  }
  size_t line_no = 0;
  for (std::string_view line : split_lines(text)) {
    const std::string decoded = tok->decode(parse_token_ids(line, ++line_no));
    std::fwrite(decoded.data(), 1, decoded.size(), stdout);
    std::fputc('\n', stdout);
  }
  return 0;
}

}  // namespace titan
