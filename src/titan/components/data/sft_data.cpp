// Chat fine-tuning data: conversations to labelled, packed windows; see sft_data.h.
#include "titan/components/data/sft_data.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/common/names.h"
#include "titan/kernels/cross_entropy.h"

#include <algorithm>

namespace titan {

namespace {

using ojson = nlohmann::ordered_json;

// DataError: `row` has no field `key`; names the row's fields and the nearest one, then `hint`.
[[noreturn]] void throw_missing_field(const ojson& row, const std::string& key,
                                      const std::string& where, const std::string& hint = "") {
  std::vector<std::string> keys;
  for (const auto& item : row.items()) keys.push_back(item.key());
  throw DataError(message(where, ": no \"", key, "\" field", did_you_mean(likely_name(key, keys)),
                          " (the row has: ", join(keys), ")", hint));
}

// The string field `key` of `row`; DataError naming the place otherwise.
std::string string_field(const ojson& row, const std::string& key, const std::string& where) {
  const auto it = row.find(key);
  if (it == row.end()) throw_missing_field(row, key, where);
  if (!it->is_string()) {
    throw DataError(message(where, ": \"", key, "\" is a ", it->type_name(), ", not a string"));
  }
  return it->get<std::string>();
}

}  // namespace

ojson conversation_of(const ojson& row, const ChatRowFormat& format, const std::string& where) {
  if (!row.is_object()) {
    throw DataError(message(where, ": a chat row must be a JSON object, got a ", row.type_name()));
  }
  ojson messages = ojson::array();
  if (!format.prompt_field.empty() || !format.response_field.empty()) {
    messages.push_back(
        {{"role", "user"}, {"content", string_field(row, format.prompt_field, where)}});
    messages.push_back(
        {{"role", "assistant"}, {"content", string_field(row, format.response_field, where)}});
  } else {
    const auto it = row.find(format.messages_field);
    if (it == row.end()) {
      throw_missing_field(row, format.messages_field, where,
                          ". HINT: set sft.messages_field, or sft.prompt_field and "
                          "sft.response_field for question/answer rows");
    }
    if (!it->is_array() || it->empty()) {
      throw DataError(message(where, ": \"", format.messages_field,
                              "\" must be a non-empty list of messages, got ",
                              it->is_array() ? "an empty list" : it->type_name()));
    }
    for (size_t m = 0; m < it->size(); ++m) {
      const ojson& msg = (*it)[m];
      if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string()) {
        throw DataError(message(where, ": message ", m,
                                " must be an object with a string \"role\", got ", msg.dump()));
      }
    }
    messages = *it;
  }
  if (!format.system_prompt.empty() &&
      !(messages[0].contains("role") && messages[0]["role"] == "system")) {
    messages.insert(messages.begin(), ojson{{"role", "system"}, {"content", format.system_prompt}});
  }
  return messages;
}

int64_t ChatSample::trained_count() const {
  return std::count(trained.begin(), trained.end(), uint8_t{1});
}

ChatEncoder::ChatEncoder(std::shared_ptr<const ChatTemplate> chat_template,
                         ChatTemplateOptions options, const Tokenizer& tokenizer)
    : template_(std::move(chat_template)), options_(std::move(options)), tokenizer_(tokenizer) {
  TITAN_CHECK(template_ != nullptr, "ChatEncoder: no chat template");
  const auto eos = options_.special_tokens.find("eos_token");
  if (eos != options_.special_tokens.end() && eos->is_string()) eos_ = eos->get<std::string>();
}

std::string ChatEncoder::render(const ojson& messages,
                                std::vector<std::pair<size_t, size_t>>* trained,
                                const std::string& where) const {
  const auto render_with = [&](const ojson& msgs, bool generation_prompt) {
    ChatTemplateOptions o = options_;
    o.add_generation_prompt = generation_prompt;
    try {
      return apply_chat_template(*template_, msgs, o);
    } catch (const DataError& e) {
      throw DataError(message(where, ": the chat template rejects the conversation: ", e.what()));
    }
  };
  const std::string full = render_with(messages, false);
  std::vector<size_t> assistants;
  for (size_t m = 0; m < messages.size(); ++m) {
    if (messages[m]["role"] == "assistant") assistants.push_back(m);
  }
  // The prompt before each assistant message, which must open the whole rendering.
  std::vector<size_t> starts;
  for (size_t m : assistants) {
    const ojson before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(m));
    const std::string prompt = m == 0 ? std::string() : render_with(before, true);
    if (m == 0 || full.compare(0, prompt.size(), prompt) != 0) {
      throw DataError(message(
          where, ": cannot tell the prompt of assistant message ", m,
          " from the reply: the chat template ",
          m == 0 ? "gets no messages before it (a conversation must not open with the assistant)"
                 : "renders the messages before it with the generation prompt differently from "
                   "how it renders them in the whole conversation",
          ". HINT: check the conversation's roles, or use a template whose prompts are prefixes"));
    }
    starts.push_back(prompt.size());
  }
  if (trained != nullptr) {
    trained->clear();
    for (size_t a = 0; a < starts.size(); ++a) {
      const size_t begin = starts[a];
      if (a + 1 == starts.size()) {
        trained->emplace_back(begin, full.size());
        continue;
      }
      const size_t limit = starts[a + 1];
      const size_t eos = eos_.empty() ? std::string::npos : full.find(eos_, begin);
      if (eos == std::string::npos || eos + eos_.size() > limit) {
        throw DataError(message(
            where, ": cannot find where assistant message ", assistants[a], " ends: ",
            eos_.empty() ? std::string("the tokenizer config names no eos_token")
                         : message("no ", eos_, " (eos_token) before the next prompt ends"),
            ". HINT: earlier assistant turns end at the eos_token; train on one turn per row"));
      }
      trained->emplace_back(begin, eos + eos_.size());
    }
  }
  return full;
}

ChatSample ChatEncoder::encode(const ojson& messages, const std::string& where) const {
  std::vector<std::pair<size_t, size_t>> spans;
  const std::string full = render(messages, &spans, where);
  ChatSample sample;
  const auto add = [&](size_t begin, size_t end, bool trained) {
    if (end <= begin) return;
    const std::vector<int64_t> ids =
        tokenizer_.encode(std::string_view(full).substr(begin, end - begin));
    sample.tokens.insert(sample.tokens.end(), ids.begin(), ids.end());
    sample.trained.insert(sample.trained.end(), ids.size(), trained ? 1 : 0);
  };
  size_t at = 0;
  for (const auto& [begin, end] : spans) {
    add(at, begin, false);
    add(begin, end, true);
    at = end;
  }
  add(at, full.size(), false);
  return sample;
}

Overlong overlong_from_name(const std::string& name, const std::string& key) {
  if (name == "drop") return Overlong::kDrop;
  if (name == "truncate") return Overlong::kTruncate;
  throw ConfigError(message(key, " = \"", name, "\" is not one of drop, truncate",
                            did_you_mean(likely_name(name, {"drop", "truncate"}))));
}

SftLoader::SftLoader(std::shared_ptr<const RecordSource> rows, ChatRowFormat format,
                     const ChatEncoder& encoder, Overlong overlong, int64_t seq_len,
                     int64_t batch_size, int64_t pad_id, bool infinite, int64_t shuffle_seed)
    : rows_(std::move(rows)),
      format_(std::move(format)),
      encoder_(encoder),
      overlong_(overlong),
      seq_len_(seq_len),
      batch_size_(batch_size),
      pad_id_(pad_id),
      infinite_(infinite),
      shuffle_seed_(shuffle_seed) {
  TITAN_CHECK(rows_ != nullptr, "SftLoader: no rows");
  TITAN_CHECK(seq_len_ >= 1 && batch_size_ >= 1, "SftLoader: seq_len and batch_size must be >= 1");
  if (rows_->size() == 0) throw DataError("the chat dataset has no rows");
  spans_ = rows_->span_starts();
}

int64_t SftLoader::current_row() {
  if (shuffle_seed_ < 0) return index_;
  if (order_epoch_ != epoch_) {
    order_ =
        shuffled_span_order(spans_, rows_->size(), static_cast<uint64_t>(shuffle_seed_ + epoch_));
    order_epoch_ = epoch_;
  }
  return order_[index_];
}

bool SftLoader::load_sample() {
  while (!sample_loaded_) {
    if (index_ == rows_->size()) {
      if (epoch_placed_ == 0) {
        throw DataError(message(
            "chat dataset: no conversation of its ", rows_->size(), " rows can be trained (",
            counts_.dropped, " longer than seq_len ", seq_len_, ", ", counts_.untrained,
            " without an assistant reply). HINT: raise training.seq_len or set sft.overlong = "
            "\"truncate\""));
      }
      if (!infinite_) return false;
      log_info("chat dataset: epoch ", epoch_, " done: ", counts_.conversations,
               " conversations in ", counts_.windows, " windows so far, ", counts_.dropped,
               " dropped and ", counts_.truncated, " truncated (longer than seq_len ", seq_len_,
               "), ", counts_.untrained, " without an assistant reply");
      ++epoch_;
      index_ = 0;
      epoch_placed_ = 0;
    }
    const int64_t row = current_row();
    const std::string where = rows_->describe(row);
    const ChatSample sample =
        encoder_.encode(conversation_of(rows_->record(row), format_, where), where);
    const auto n = static_cast<int64_t>(sample.tokens.size());
    int64_t take = n - 1;  // positions: each token but the last predicts the next
    // The first token is never predicted, so it does not count as trained.
    const int64_t predicted = n == 0 ? 0 : sample.trained_count() - sample.trained[0];
    if (take < 1 || predicted == 0) {
      if (counts_.untrained == 0) {
        log_warning("chat dataset: ", where, " has no assistant reply to train on; skipped ",
                    "(counted in the epoch summaries)");
      }
      ++counts_.untrained;
      ++index_;
      continue;
    }
    if (take > seq_len_) {
      if (overlong_ == Overlong::kDrop) {
        if (counts_.dropped == 0) {
          log_warning("chat dataset: ", where, " has ", take, " positions, more than seq_len ",
                      seq_len_,
                      "; dropped (sft.overlong = \"drop\"; counted in the epoch "
                      "summaries)");
        }
        ++counts_.dropped;
        ++index_;
        continue;
      }
      if (counts_.truncated == 0) {
        log_warning("chat dataset: ", where, " has ", take, " positions, more than seq_len ",
                    seq_len_,
                    "; truncated (sft.overlong = \"truncate\"; counted in the epoch "
                    "summaries)");
      }
      take = seq_len_;
    }
    sample_inputs_.assign(sample.tokens.begin(), sample.tokens.begin() + take);
    sample_labels_.resize(static_cast<size_t>(take));
    bool any = false;
    for (int64_t i = 0; i < take; ++i) {
      sample_labels_[i] = sample.trained[i + 1] ? sample.tokens[i + 1] : kernels::kIgnoreIndex;
      any |= sample.trained[i + 1] != 0;
    }
    if (!any) {  // truncation kept only the prompt
      ++counts_.dropped;
      ++index_;
      continue;
    }
    if (take < n - 1) ++counts_.truncated;
    sample_loaded_ = true;
  }
  return true;
}

bool SftLoader::fill_window(int64_t* inputs, int64_t* labels, int64_t* positions,
                            int64_t* documents) {
  int64_t used = 0, doc = 0;
  while (load_sample()) {
    const auto n = static_cast<int64_t>(sample_inputs_.size());
    if (used + n > seq_len_) break;  // the window is full: this sample opens the next
    for (int64_t i = 0; i < n; ++i) {
      inputs[used + i] = sample_inputs_[i];
      labels[used + i] = sample_labels_[i];
      positions[used + i] = i;
      documents[used + i] = doc;
      counts_.trained_tokens += sample_labels_[i] != kernels::kIgnoreIndex;
    }
    used += n;
    ++doc;
    ++counts_.conversations;
    ++epoch_placed_;
    ++index_;
    sample_loaded_ = false;
  }
  if (used == 0) return false;
  for (int64_t i = used; i < seq_len_; ++i) {  // padding: its own document, nothing predicted
    inputs[i] = pad_id_;
    labels[i] = kernels::kIgnoreIndex;
    positions[i] = i - used;
    documents[i] = doc;
  }
  counts_.padding += seq_len_ - used;
  ++counts_.windows;
  return true;
}

std::optional<Batch> SftLoader::next() {
  const auto opts = at::TensorOptions(at::kLong);
  Batch batch;
  batch.inputs = at::empty({batch_size_, seq_len_}, opts);
  batch.labels = at::empty({batch_size_, seq_len_}, opts);
  batch.positions = at::empty({batch_size_, seq_len_}, opts);
  batch.document_ids = at::empty({batch_size_, seq_len_}, opts);
  for (int64_t b = 0; b < batch_size_; ++b) {
    const int64_t at = b * seq_len_;
    if (!fill_window(batch.inputs.data_ptr<int64_t>() + at, batch.labels.data_ptr<int64_t>() + at,
                     batch.positions.data_ptr<int64_t>() + at,
                     batch.document_ids.data_ptr<int64_t>() + at)) {
      return std::nullopt;  // a finite loader's last, partial batch is dropped
    }
  }
  return batch;
}

nlohmann::json SftLoader::state_json() const {
  return {{"kind", "sft"},
          {"epoch", epoch_},
          {"index", index_},
          {"epoch_placed", epoch_placed_},
          {"shuffle_seed", shuffle_seed_},
          {"rows", rows_->size()},
          {"counts",
           {counts_.conversations, counts_.dropped, counts_.truncated, counts_.untrained,
            counts_.windows, counts_.trained_tokens, counts_.padding}}};
}

void SftLoader::load_state_json(const nlohmann::json& j) {
  const auto fail = [&](const std::string& what) {
    throw DataError(message("chat data loader state ", j.dump().substr(0, 200), ": ", what,
                            ". HINT: resume with the dataset and sft settings of the checkpoint"));
  };
  if (!j.is_object() || j.value("kind", "") != "sft") {
    fail("not a chat (sft) loader's state: the checkpoint was written with another dataset");
  }
  for (const char* key : {"epoch", "index", "epoch_placed", "shuffle_seed", "rows"}) {
    if (!j.contains(key) || !j.at(key).is_number_integer())
      fail(message("no integer \"", key, "\""));
  }
  if (j.at("rows").get<int64_t>() != rows_->size()) {
    fail(message("it was written for ", j.at("rows").get<int64_t>(), " rows, the dataset has ",
                 rows_->size()));
  }
  const int64_t index = j.at("index").get<int64_t>();
  if (index < 0 || index > rows_->size() || j.at("epoch").get<int64_t>() < 0) {
    fail("epoch or row index out of range");
  }
  const nlohmann::json& c = j.value("counts", nlohmann::json());
  if (!c.is_array() || c.size() != 7) fail("no \"counts\" of 7 integers");
  const int64_t seed = j.at("shuffle_seed").get<int64_t>();
  if (seed != shuffle_seed_) {
    log_warning("chat data loader: resuming with the saved row order (shuffle seed ", seed,
                ") instead of the configured one (", shuffle_seed_, ")");
  }
  shuffle_seed_ = seed;
  order_epoch_ = -1;
  epoch_ = j.at("epoch").get<int64_t>();
  index_ = index;
  epoch_placed_ = j.at("epoch_placed").get<int64_t>();
  counts_ =
      SftCounts{c[0].get<int64_t>(), c[1].get<int64_t>(), c[2].get<int64_t>(), c[3].get<int64_t>(),
                c[4].get<int64_t>(), c[5].get<int64_t>(), c[6].get<int64_t>()};
  sample_loaded_ = false;
}

}  // namespace titan
