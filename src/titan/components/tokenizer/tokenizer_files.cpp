// Tokenizer file readers. Byte-level vocabularies (tokenizer.json, vocab.json) spell each byte as
// one printable character (GPT-2's bytes_to_unicode table); tokens are converted back to raw
// bytes here so BpeTokenizer only ever sees bytes.
#include "titan/components/tokenizer/tokenizer_files.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/components/tokenizer/unicode.h"
#include "titan/components/tokenizer/unigram.h"

#include <nlohmann/json.hpp>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

namespace titan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text_file(const std::string& path) {
  return read_regular_file(path, "tokenizer file");
}

json parse_json(const std::string& path) {
  try {
    return json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    throw DataError(path + ": not valid JSON (" + e.what() + ")");
  }
}

// GPT-2's byte <-> printable character table: printable Latin-1 bytes stand for themselves, the
// other 68 bytes take the code points 256, 257, ... in byte order.
const std::array<int, 324>& unicode_to_byte() {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t;
    t.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[printable ? b : next++] = b;
    }
    return t;
  }();
  return table;
}

// Raw bytes of a byte-level token; nullopt if it uses a character outside the table.
std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string bytes;
  size_t pos = 0;
  while (pos < token.size()) {
    size_t len;
    const uint32_t cp = decode_utf8(token, pos, &len);
    if (cp >= unicode_to_byte().size() || unicode_to_byte()[cp] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(unicode_to_byte()[cp]));
    pos += len;
  }
  return bytes;
}

// Fills model->tokens from a {"token": id} object of byte-level tokens.
void read_byte_level_vocab(const json& vocab, const std::string& path, BpeModel* model) {
  if (!vocab.is_object()) throw DataError(path + ": the vocabulary is not a JSON object");
  const int64_t max_id = static_cast<int64_t>(vocab.size()) + BpeModel::kMaxUnusedIds;
  for (const auto& [token, id_json] : vocab.items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= max_id) {
      throw DataError(path + ": token '" + token + "' has an invalid id " + id_json.dump() +
                      " (want 0 <= id < " + std::to_string(max_id) + ": the " +
                      std::to_string(vocab.size()) + " entries plus at most " +
                      std::to_string(BpeModel::kMaxUnusedIds) + " unused ids)");
    }
    const int64_t id = id_json.get<int64_t>();
    std::optional<std::string> bytes = byte_level_to_bytes(token);
    if (!bytes || bytes->empty()) {
      throw DataError(path + ": token '" + token + "' (id " + std::to_string(id) +
                      ") is not a byte-level BPE token");
    }
    if (id >= static_cast<int64_t>(model->tokens.size())) model->tokens.resize(id + 1);
    if (!model->tokens[id].empty()) {
      throw DataError(path + ": id " + std::to_string(id) + " appears twice in the vocabulary");
    }
    model->tokens[id] = std::move(*bytes);
  }
}

int32_t token_id(const std::unordered_map<std::string, int32_t>& ids, const std::string& token,
                 const std::string& path, size_t rank) {
  auto it = ids.find(token);
  if (it == ids.end()) {
    throw DataError(path + ": merge " + std::to_string(rank) + " uses '" + token +
                    "', which is not in the vocabulary");
  }
  return it->second;
}

void add_merge(const std::unordered_map<std::string, int32_t>& ids, const std::string& left,
               const std::string& right, const std::string& path, BpeModel* model) {
  const size_t rank = model->merges.size();
  model->merges.emplace_back(token_id(ids, left, path, rank), token_id(ids, right, path, rank));
}

std::unordered_map<std::string, int32_t> byte_level_ids(const json& vocab) {
  std::unordered_map<std::string, int32_t> ids;
  for (const auto& [token, id] : vocab.items()) ids.emplace(token, id.get<int32_t>());
  return ids;
}

// BOS/EOS from the special tokens: Llama 3's names, else GPT-2's <|endoftext|> for both.
void pick_bos_eos(const std::unordered_map<std::string, int64_t>& named, BpeModel* model) {
  auto find = [&](const char* name) -> std::optional<int64_t> {
    auto it = named.find(name);
    return it == named.end() ? std::nullopt : std::optional<int64_t>(it->second);
  };
  model->bos_id = find("<|begin_of_text|>");
  model->eos_id = find("<|end_of_text|>");
  if (!model->bos_id) model->bos_id = find("<|startoftext|>");  // CLIP
  if (!model->bos_id) model->bos_id = find("<|endoftext|>");
  if (!model->eos_id) model->eos_id = find("<|endoftext|>");
}

// Reads a pre_tokenizer object into *model; ConfigError for what we do not implement.
void read_pre_tokenizer(const json& pt, const std::string& path, bool* byte_level,
                        std::optional<PreTokenizer>* split, BpeModel* model) {
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const json& inner : pt.at("pretokenizers")) {
      read_pre_tokenizer(inner, path, byte_level, split, model);
    }
  } else if (type == "ByteLevel") {
    *byte_level = true;
    model->add_prefix_space = pt.value("add_prefix_space", false);
    if (pt.value("use_regex", true)) {
      if (*split == PreTokenizer::kClip) {
        *split = PreTokenizer::kClipThenGpt2;
        return;
      }
      if (*split) throw ConfigError(message(path, ": two pre-tokenizer regexes are not supported"));
      *split = PreTokenizer::kGpt2;
    }
  } else if (type == "Split") {
    const json& pattern = pt.at("pattern");
    const std::string regex =
        pattern.contains("Regex") ? pattern.at("Regex").get<std::string>() : std::string();
    std::optional<PreTokenizer> kind = pre_tokenizer_from_pattern(regex);
    // GPT-2's and Llama 3's regexes isolate their matches; CLIP's keeps them and removes the rest.
    const bool clip = kind == PreTokenizer::kClip;
    if (!kind || pt.value("behavior", "") != (clip ? "Removed" : "Isolated") ||
        pt.value("invert", false) != clip) {
      throw ConfigError(message(path, ": unsupported Split pre-tokenizer ", pt.dump(),
                                "; only the GPT-2 and Llama-3 regexes with behavior Isolated and "
                                "CLIP's with behavior Removed, inverted, are implemented"));
    }
    if (*split) throw ConfigError(message(path, ": two pre-tokenizer regexes are not supported"));
    *split = kind;
  } else {
    throw ConfigError(message(path, ": unsupported pre-tokenizer type '", type,
                              "'; supported: ByteLevel, Split (GPT-2 / Llama-3 regex), Sequence"));
  }
}

// Llama 3's special tokens, in id order after its 128000 ranks (as in TorchTitan / Meta's
// tokenizer.py): 10 named ones, then reserved tokens up to 256 in all.
std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> names = {"<|begin_of_text|>",
                                    "<|end_of_text|>",
                                    "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>",
                                    "<|reserved_special_token_2|>",
                                    "<|reserved_special_token_3|>",
                                    "<|start_header_id|>",
                                    "<|end_header_id|>",
                                    "<|reserved_special_token_4|>",
                                    "<|eot_id|>"};
  for (int i = 5; names.size() < 256; ++i) {
    names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  }
  return names;
}

constexpr int64_t kLlama3NumRanks = 128000;

// ---- Unigram (T5) ---------------------------------------------------------------------------

// The pre_tokenizer of a unigram tokenizer.json: Metaspace, optionally after WhitespaceSplit,
// possibly in a Sequence.
void read_unigram_pre_tokenizer(const json& pt, const std::string& path, bool* metaspace,
                                UnigramModel* model) {
  if (pt.is_null()) return;
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const json& inner : pt.at("pretokenizers")) {
      read_unigram_pre_tokenizer(inner, path, metaspace, model);
    }
  } else if (type == "WhitespaceSplit") {
    if (*metaspace) {
      throw ConfigError(message(path, ": WhitespaceSplit after Metaspace is not supported"));
    }
    model->whitespace_split = true;
  } else if (type == "Metaspace") {
    if (pt.value("replacement", std::string("\xE2\x96\x81")) != "\xE2\x96\x81") {
      throw ConfigError(message(path, ": Metaspace replacement ", pt["replacement"].dump(),
                                " is not supported (only U+2581)"));
    }
    const std::string scheme =
        pt.contains("prepend_scheme")
            ? pt.at("prepend_scheme").get<std::string>()
            : (pt.value("add_prefix_space", true) ? std::string("always") : std::string("never"));
    if (scheme == "always") {
      model->prepend = UnigramModel::Prepend::kAlways;
    } else if (scheme == "first") {
      model->prepend = UnigramModel::Prepend::kFirst;
    } else if (scheme == "never") {
      model->prepend = UnigramModel::Prepend::kNever;
    } else {
      throw ConfigError(message(path, ": Metaspace prepend_scheme '", scheme, "' is unknown"));
    }
    model->split_on_replacement = pt.value("split", true);
    *metaspace = true;
  } else {
    throw ConfigError(message(path, ": unsupported pre-tokenizer type '", type,
                              "' for a unigram model; supported: Metaspace, WhitespaceSplit, "
                              "Sequence"));
  }
}

// BOS / EOS / padding of a unigram vocabulary, by SentencePiece's names.
void pick_unigram_specials(UnigramModel* model) {
  std::unordered_map<std::string, int64_t> named;
  for (size_t id = 0; id < model->pieces.size(); ++id) {
    named.emplace(model->pieces[id].first, static_cast<int64_t>(id));
  }
  for (const AddedToken& t : model->added_tokens) named[t.content] = t.id;
  const auto find = [&](const char* name) -> std::optional<int64_t> {
    auto it = named.find(name);
    return it == named.end() ? std::nullopt : std::optional<int64_t>(it->second);
  };
  model->bos_id = find("<s>");
  model->eos_id = find("</s>");
  model->pad_id = find("<pad>");
}

UnigramModel read_unigram_json(const json& root, const std::string& path) {
  UnigramModel model;
  model.source = path;
  const json& m = root.at("model");
  for (const json& entry : m.at("vocab")) {
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() || !entry[1].is_number()) {
      throw DataError(message(path, ": unigram vocabulary entry ", model.pieces.size(), " is ",
                              entry.dump(), " (want [piece, score])"));
    }
    model.pieces.emplace_back(entry[0].get<std::string>(), entry[1].get<double>());
  }
  const json unk = m.value("unk_id", json());
  if (!unk.is_null()) model.unk_id = unk.get<int64_t>();
  model.byte_fallback = m.value("byte_fallback", false);
  model.normalizer = TextNormalizer::from_json(root.value("normalizer", json()), path);
  bool metaspace = false;
  read_unigram_pre_tokenizer(root.value("pre_tokenizer", json()), path, &metaspace, &model);
  if (!metaspace) {
    throw ConfigError(message(path, ": a unigram tokenizer needs a Metaspace pre-tokenizer; got ",
                              root.value("pre_tokenizer", json()).dump()));
  }
  for (const json& added : root.value("added_tokens", json::array())) {
    const json& id_json = added.at("id");
    if (!id_json.is_number_integer()) {
      throw DataError(path + ": added token " + added.at("content").dump() +
                      " has a non-integer id " + id_json.dump());
    }
    AddedToken t;
    t.content = added.at("content").get<std::string>();
    t.id = id_json.get<int64_t>();
    t.special = added.value("special", false);
    t.normalized = added.value("normalized", !t.special);
    model.added_tokens.push_back(std::move(t));
  }
  pick_unigram_specials(&model);
  return model;
}

// A minimal protocol-buffer reader for SentencePiece's ModelProto: varints, 32/64-bit fixed
// fields and length-delimited fields; every read is bounds-checked and errors name the offset.
class ProtoReader {
 public:
  ProtoReader(std::string_view data, size_t base, const std::string& path)
      : data_(data), base_(base), path_(path) {}

  bool done() const { return pos_ >= data_.size(); }
  size_t offset() const { return base_ + pos_; }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) fail("a varint runs past the end");
      const unsigned char b = static_cast<unsigned char>(data_[pos_++]);
      value |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return value;
    }
    fail("a varint is longer than 10 bytes");
  }

  // The next field's (number, wire type).
  std::pair<uint32_t, uint32_t> tag() {
    const uint64_t key = varint();
    return {static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7)};
  }

  std::string_view bytes(size_t* at) {
    const uint64_t n = varint();
    if (n > data_.size() - pos_)
      fail("a field of " + std::to_string(n) + " bytes runs past the end");
    *at = base_ + pos_;
    const std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }

  float fixed32_float() {
    if (data_.size() - pos_ < 4) fail("a 32-bit field runs past the end");
    float value;
    std::memcpy(&value, data_.data() + pos_, 4);
    pos_ += 4;
    return value;
  }

  void skip(uint32_t wire) {
    size_t at;
    switch (wire) {
      case 0: varint(); return;
      case 1:
        if (data_.size() - pos_ < 8) fail("a 64-bit field runs past the end");
        pos_ += 8;
        return;
      case 2: bytes(&at); return;
      case 5:
        if (data_.size() - pos_ < 4) fail("a 32-bit field runs past the end");
        pos_ += 4;
        return;
      default: fail("wire type " + std::to_string(wire) + " is not a SentencePiece field");
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(
        message(path_, ": not a SentencePiece model at byte offset ", base_ + pos_, ": ", what));
  }

 private:
  std::string_view data_;
  size_t base_;
  size_t pos_ = 0;
  const std::string& path_;
};

// SentencePiece piece types (sentencepiece_model.proto).
enum SentencePieceType : uint64_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

}  // namespace

UnigramModel read_sentencepiece_model(const std::string& path, int64_t extra_ids) {
  const std::string data = read_regular_file(path, "tokenizer file");
  UnigramModel model;
  model.source = path;
  std::string charsmap;
  bool has_charsmap = false;
  uint64_t model_type = 1;  // UNIGRAM unless the trainer spec says otherwise
  std::vector<uint64_t> types;
  ProtoReader top(data, 0, path);
  while (!top.done()) {
    const auto [field, wire] = top.tag();
    size_t at;
    if (field == 1 && wire == 2) {  // SentencePiece
      ProtoReader piece(top.bytes(&at), at, path);
      std::string text;
      float score = 0.0f;
      uint64_t type = kNormal;
      while (!piece.done()) {
        const auto [f, w] = piece.tag();
        size_t inner;
        if (f == 1 && w == 2) {
          text = std::string(piece.bytes(&inner));
        } else if (f == 2 && w == 5) {
          score = piece.fixed32_float();
        } else if (f == 3 && w == 0) {
          type = piece.varint();
        } else {
          piece.skip(w);
        }
      }
      model.pieces.emplace_back(std::move(text), static_cast<double>(score));
      types.push_back(type);
    } else if (field == 2 && wire == 2) {  // TrainerSpec
      ProtoReader spec(top.bytes(&at), at, path);
      while (!spec.done()) {
        const auto [f, w] = spec.tag();
        if (f == 3 && w == 0) {
          model_type = spec.varint();
        } else if (f == 35 && w == 0) {
          model.byte_fallback = spec.varint() != 0;
        } else {
          spec.skip(w);
        }
      }
    } else if (field == 3 && wire == 2) {  // NormalizerSpec
      ProtoReader spec(top.bytes(&at), at, path);
      while (!spec.done()) {
        const auto [f, w] = spec.tag();
        size_t inner;
        if (f == 2 && w == 2) {
          charsmap = std::string(spec.bytes(&inner));
          has_charsmap = !charsmap.empty();
        } else {
          spec.skip(w);
        }
      }
    } else {
      top.skip(wire);
    }
  }
  if (model.pieces.empty()) throw DataError(path + ": not a SentencePiece model (no pieces)");
  if (model_type != 1) {
    throw ConfigError(message(path, ": SentencePiece model type ", model_type,
                              " is not supported (only unigram, type 1: T5's)"));
  }
  // As transformers' T5Tokenizer builds it: the charsmap, white-space split, '▁' prepended,
  // the sentinel tokens <extra_id_N> appended in reverse order, control pieces as specials.
  if (has_charsmap) model.normalizer = TextNormalizer::precompiled(std::move(charsmap), path);
  model.whitespace_split = true;
  for (size_t id = 0; id < types.size(); ++id) {
    if (types[id] == kUnknown && !model.unk_id) model.unk_id = static_cast<int64_t>(id);
    if (types[id] == kControl || types[id] == kUnknown) {
      model.added_tokens.push_back({model.pieces[id].first, static_cast<int64_t>(id), true, false});
    }
  }
  for (int64_t i = extra_ids - 1; i >= 0; --i) {
    const std::string name = "<extra_id_" + std::to_string(i) + ">";
    model.added_tokens.push_back({name, static_cast<int64_t>(model.pieces.size()), true, false});
    model.pieces.emplace_back(name, 0.0);
  }
  pick_unigram_specials(&model);
  return model;
}

namespace {

// ---- CLIP -----------------------------------------------------------------------------------

// CLIP's text pipeline as transformers' CLIPTokenizer builds it: NFC, runs of white space to one
// space, lowercase; CLIP's regex with white space removed; "</w>" ends each word; <|endoftext|>
// also pads.
void make_clip(BpeModel* model, const std::string& path) {
  const json normalizer = json::parse(R"({"type": "Sequence", "normalizers": [
      {"type": "NFC"}, {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
      {"type": "Lowercase"}]})");
  model->normalizer = TextNormalizer::from_json(normalizer, path);
  model->pre_tokenizer = PreTokenizer::kClipThenGpt2;
  model->end_of_word_suffix = "</w>";
}

}  // namespace

std::optional<std::string> decode_base64(std::string_view text) {
  const auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const int v = value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

namespace {

BpeModel read_bpe_json(const json& root, const std::string& path) {
  BpeModel model;
  model.source = path;
  try {
    const json& m = root.at("model");
    if (m.value("type", "BPE") != "BPE") {
      throw ConfigError(message(path, ": model.type is '", m.value("type", ""),
                                "'; supported: BPE (byte-level) and Unigram"));
    }
    if (!m.value("continuing_subword_prefix", json()).is_null() &&
        !m["continuing_subword_prefix"].get<std::string>().empty()) {
      throw ConfigError(message(path, ": continuing_subword_prefix is not supported"));
    }
    if (!m.value("end_of_word_suffix", json()).is_null()) {
      model.end_of_word_suffix = m["end_of_word_suffix"].get<std::string>();
    }
    model.normalizer = TextNormalizer::from_json(root.value("normalizer", json()), path);
    model.ignore_merges = m.value("ignore_merges", false);
    const json& vocab = m.at("vocab");
    read_byte_level_vocab(vocab, path, &model);
    const auto ids = byte_level_ids(vocab);
    for (const json& merge : m.at("merges")) {
      if (merge.is_string()) {
        const std::string s = merge.get<std::string>();
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos) throw DataError(path + ": bad merge '" + s + "'");
        add_merge(ids, s.substr(0, space), s.substr(space + 1), path, &model);
      } else if (merge.is_array() && merge.size() == 2) {
        add_merge(ids, merge[0].get<std::string>(), merge[1].get<std::string>(), path, &model);
      } else {
        throw DataError(path + ": bad merge " + merge.dump());
      }
    }
    const json pt = root.value("pre_tokenizer", json());
    if (pt.is_null()) throw ConfigError(message(path, ": a byte-level BPE needs a pre_tokenizer"));
    bool byte_level = false;
    std::optional<PreTokenizer> split;
    read_pre_tokenizer(pt, path, &byte_level, &split, &model);
    if (!byte_level || !split) {
      throw ConfigError(message(path,
                                ": the pre-tokenizer must be ByteLevel with a GPT-2 or Llama-3 "
                                "regex; got ",
                                pt.dump()));
    }
    model.pre_tokenizer = *split;
    std::unordered_map<std::string, int64_t> named;
    for (const json& added : root.value("added_tokens", json::array())) {
      const std::string content = added.at("content").get<std::string>();
      // A float id (1e300) would be converted with undefined behaviour (found by tests/fuzz).
      const json& id_json = added.at("id");
      if (!id_json.is_number_integer()) {
        throw DataError(path + ": added token '" + content + "' has a non-integer id " +
                        id_json.dump());
      }
      const int64_t id = id_json.get<int64_t>();
      model.special_tokens.emplace_back(content, id);
      named.emplace(content, id);
    }
    model.match_special_tokens = true;
    if (ids.count("<|endoftext|>")) named.emplace("<|endoftext|>", ids.at("<|endoftext|>"));
    pick_bos_eos(named, &model);
    if (!model.end_of_word_suffix.empty()) model.pad_id = model.eos_id;  // CLIP's padding
  } catch (const json::exception& e) {
    throw DataError(path + ": unexpected tokenizer.json layout (" + e.what() + ")");
  }
  return model;
}

// A SentencePiece model starts with its first piece (field 1, length-delimited: byte 0x0A);
// a tiktoken file with base64 text.
bool is_sentencepiece_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return in.get() == 0x0A;  // only the first byte: the reader reads the file once after
}

// transformers' T5Tokenizer: "extra_ids" sentinel tokens (default 100) from tokenizer_config.json.
int64_t t5_extra_ids(const fs::path& config) {
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) return 100;
  const json root = parse_json(config.string());
  const json n = root.value("extra_ids", json(100));
  if (!n.is_number_integer() || n.get<int64_t>() < 0 || n.get<int64_t>() > 100000) {
    throw DataError(message(config.string(), ": extra_ids is ", n.dump(),
                            " (want a count of sentinel tokens, 0 to 100000)"));
  }
  return n.get<int64_t>();
}

}  // namespace

BpeModel read_hf_tokenizer_json(const std::string& path) {
  return read_bpe_json(parse_json(path), path);
}

std::unique_ptr<Tokenizer> read_tokenizer_json(const std::string& path) {
  const json root = parse_json(path);
  try {
    if (root.at("model").value("type", "BPE") == "Unigram") {
      return std::make_unique<UnigramTokenizer>(read_unigram_json(root, path));
    }
  } catch (const json::exception& e) {
    throw DataError(path + ": unexpected tokenizer.json layout (" + e.what() + ")");
  }
  return std::make_unique<BpeTokenizer>(read_bpe_json(root, path));
}

BpeModel read_gpt2_vocab(const std::string& vocab_path, const std::string& merges_path) {
  const json vocab = parse_json(vocab_path);
  BpeModel model;
  model.source = vocab_path;
  std::unordered_map<std::string, int32_t> ids;
  try {
    read_byte_level_vocab(vocab, vocab_path, &model);
    ids = byte_level_ids(vocab);
  } catch (const json::exception& e) {
    throw DataError(vocab_path + ": unexpected vocabulary layout (" + e.what() + ")");
  }
  std::istringstream lines(read_text_file(merges_path));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("#version", 0) == 0) continue;
    std::istringstream fields(line);
    std::string left, right, extra;
    if (!(fields >> left)) continue;  // blank line
    if (!(fields >> right) || (fields >> extra)) {
      throw DataError(merges_path + ": bad merge line '" + line + "' (want 'left right')");
    }
    add_merge(ids, left, right, merges_path, &model);
  }
  if (model.merges.empty()) throw DataError(merges_path + ": no merge rules");
  std::unordered_map<std::string, int64_t> named;
  for (const char* name : {"<|endoftext|>", "<|startoftext|>"}) {
    if (ids.count(name)) named.emplace(name, ids.at(name));
  }
  pick_bos_eos(named, &model);
  // CLIP's files (its start token and "</w>"-suffixed tokens): CLIP's text pipeline, its two
  // special tokens matched in text.
  if (ids.count("<|startoftext|>") && ids.count("a</w>")) {
    make_clip(&model, vocab_path);
    for (const auto& [name, id] : named) model.special_tokens.emplace_back(name, id);
    model.match_special_tokens = true;
    model.pad_id = model.eos_id;
  }
  return model;
}

BpeModel read_tiktoken(const std::string& path) {
  BpeModel model;
  model.source = path;
  model.merges_from_ranks = true;
  model.ignore_merges = true;
  model.pre_tokenizer = PreTokenizer::kLlama3;
  std::istringstream lines(read_text_file(path));
  std::string line;
  int64_t line_no = 0;
  // (rank, token bytes, line number): the ranks are bounded by their count before the table of
  // tokens by rank is allocated.
  std::vector<std::tuple<int64_t, std::string, int64_t>> ranks;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    std::optional<std::string> bytes =
        space == std::string::npos ? std::nullopt : decode_base64(line.substr(0, space));
    int64_t rank = -1;
    try {
      size_t used = 0;
      if (space != std::string::npos) rank = std::stoll(line.substr(space + 1), &used);
      if (used != line.size() - space - 1) rank = -1;
    } catch (const std::exception&) {
      rank = -1;
    }
    if (!bytes || bytes->empty() || rank < 0) {
      throw DataError(path + ":" + std::to_string(line_no) +
                      ": not a tiktoken rank line (want '<base64 token> <rank>')");
    }
    ranks.emplace_back(rank, std::move(*bytes), line_no);
  }
  const int64_t num_ranks = static_cast<int64_t>(ranks.size());
  const int64_t max_rank = num_ranks + BpeModel::kMaxUnusedIds;
  for (auto& [rank, bytes, at_line] : ranks) {
    const std::string where =
        path + ":" + std::to_string(at_line) + ": rank " + std::to_string(rank);
    if (rank >= max_rank) {
      throw DataError(where + " is too large (want < " + std::to_string(max_rank) + ": the " +
                      std::to_string(num_ranks) + " ranks plus at most " +
                      std::to_string(BpeModel::kMaxUnusedIds) + " unused ones)");
    }
    if (rank >= static_cast<int64_t>(model.tokens.size())) model.tokens.resize(rank + 1);
    if (!model.tokens[rank].empty()) throw DataError(where + " appears twice");
    model.tokens[rank] = std::move(bytes);
  }
  if (num_ranks == 0) throw DataError(path + ": no tiktoken ranks in the file");
  if (num_ranks == kLlama3NumRanks) {
    std::unordered_map<std::string, int64_t> named;
    const std::vector<std::string> names = llama3_special_tokens();
    for (size_t i = 0; i < names.size(); ++i) {
      model.special_tokens.emplace_back(names[i], kLlama3NumRanks + static_cast<int64_t>(i));
      named.emplace(names[i], kLlama3NumRanks + static_cast<int64_t>(i));
    }
    pick_bos_eos(named, &model);
  }
  return model;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    std::string where;
    if (fs::path(path).is_relative()) {
      where = " (relative to the current directory " + fs::current_path(ec).string() + ")";
    }
    // The default configs name a tokenizer that scripts/setup.sh trains and links.
    const std::string hint =
        path.find("assets/tokenizer") == std::string::npos
            ? ""
            : ". HINT: assets/tokenizer/sotu_2k is built by scripts/setup.sh "
              "(scripts/build_tokenizer.sh); run it, and run titan from the repository root";
    throw ConfigError(
        message("model.hf_assets_path: '", path, "' does not exist", where,
                "; point it at a tokenizer.json, a tiktoken file or a folder holding one, "
                "or leave it empty for the byte-level tokenizer",
                hint));
  }
  if (!fs::is_directory(path, ec)) {
    if (fs::path(path).extension() == ".json") return read_tokenizer_json(path);
    if (fs::path(path).extension() == ".model" && is_sentencepiece_model(path)) {
      return std::make_unique<UnigramTokenizer>(read_sentencepiece_model(path, 100));
    }
    return std::make_unique<BpeTokenizer>(read_tiktoken(path));
  }
  const fs::path dir(path);
  const auto has = [&](const char* name) { return fs::is_regular_file(dir / name, ec); };
  if (has("tokenizer.json")) return read_tokenizer_json((dir / "tokenizer.json").string());
  if (has("spiece.model")) {
    return std::make_unique<UnigramTokenizer>(read_sentencepiece_model(
        (dir / "spiece.model").string(), t5_extra_ids(dir / "tokenizer_config.json")));
  }
  if (has("vocab.json") && has("merges.txt")) {
    return std::make_unique<BpeTokenizer>(
        read_gpt2_vocab((dir / "vocab.json").string(), (dir / "merges.txt").string()));
  }
  if (has("encoder.json") && has("vocab.bpe")) {
    return std::make_unique<BpeTokenizer>(
        read_gpt2_vocab((dir / "encoder.json").string(), (dir / "vocab.bpe").string()));
  }
  for (const char* name : {"tokenizer.model", "original/tokenizer.model"}) {
    if (has(name)) return std::make_unique<BpeTokenizer>(read_tiktoken((dir / name).string()));
  }
  throw ConfigError(
      message("model.hf_assets_path: '", path,
              "' holds no tokenizer files (looked for tokenizer.json, spiece.model, vocab.json "
              "+ merges.txt, encoder.json + vocab.bpe, tokenizer.model); leave it empty for "
              "the byte-level tokenizer"));
}

}  // namespace titan
