// Packs tokenized documents into (batch, seq_len) input/label batches; see data_loader.h.
#include "titan/components/data/data_loader.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"

#include <algorithm>
#include <limits>
#include <random>

namespace titan {

std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    order[i] = i;
  }
  std::mt19937_64 rng(seed);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  for (int64_t i = n - 1; i > 0; --i) {
    // Uniform in [0, i] without modulo bias: reject draws from the incomplete last block.
    const auto bound = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = kMax - kMax % bound;
    uint64_t r = rng();
    while (r >= limit) {
      r = rng();
    }
    std::swap(order[i], order[r % bound]);
  }
  return order;
}

std::vector<int64_t> shuffled_span_order(const std::vector<int64_t>& span_starts, int64_t n,
                                         uint64_t seed) {
  if (span_starts.empty()) {
    return shuffled_order(n, seed);
  }
  const auto num_spans = static_cast<int64_t>(span_starts.size());
  for (int64_t s = 0; s < num_spans; ++s) {
    const bool ok = s == 0 ? span_starts[0] == 0 : span_starts[s] > span_starts[s - 1];
    if (!ok || span_starts[s] >= n) {
      throw DataError("shuffled_span_order: span starts must ascend from 0 below " +
                      std::to_string(n) + "; span " + std::to_string(s) + " starts at " +
                      std::to_string(span_starts[s]));
    }
  }
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n));
  for (int64_t s : shuffled_order(num_spans, seed)) {
    const int64_t first = span_starts[s];
    const int64_t end = s + 1 < num_spans ? span_starts[s + 1] : n;
    // A seed per span, mixed (splitmix64's constant) so that neighbouring spans and seeds do not
    // draw related permutations.
    const uint64_t span_seed =
        (seed ^ 0x9E3779B97F4A7C15ULL) * 0xBF58476D1CE4E5B9ULL + static_cast<uint64_t>(s) + 1;
    for (int64_t local : shuffled_order(end - first, span_seed)) {
      order.push_back(first + local);
    }
  }
  return order;
}

DataLoader::DataLoader(std::shared_ptr<const std::vector<Document>> docs,
                       const Tokenizer& tokenizer, int64_t seq_len, int64_t batch_size,
                       int64_t dp_rank, int64_t dp_world, bool infinite)
    : DataLoader(std::make_shared<MemoryDocumentSource>(std::move(docs)), tokenizer, seq_len,
                 batch_size, dp_rank, dp_world, infinite) {}

DataLoader::DataLoader(std::shared_ptr<const DocumentSource> source, const Tokenizer& tokenizer,
                       int64_t seq_len, int64_t batch_size, int64_t dp_rank, int64_t dp_world,
                       bool infinite, int64_t shuffle_seed)
    : source_(std::move(source)),
      tokenizer_(tokenizer),
      seq_len_(seq_len),
      batch_size_(batch_size),
      dp_rank_(dp_rank),
      dp_world_(dp_world),
      infinite_(infinite),
      shuffle_seed_(shuffle_seed) {
  TITAN_CHECK(source_ != nullptr, "DataLoader: document source must not be null");
  TITAN_CHECK(seq_len_ >= 1, "DataLoader: seq_len must be >= 1, got ", seq_len_);
  TITAN_CHECK(batch_size_ >= 1, "DataLoader: batch_size must be >= 1, got ", batch_size_);
  TITAN_CHECK(dp_world_ >= 1 && dp_rank_ >= 0 && dp_rank_ < dp_world_,
              "DataLoader: need 0 <= dp_rank < dp_world, got dp_rank ", dp_rank_, " and dp_world ",
              dp_world_);
  const int64_t written_vocab = source_->token_vocab_size();
  if (written_vocab != 0 && written_vocab != tokenizer_.vocab_size()) {
    throw DataError("DataLoader: the pre-tokenized data was written by a tokenizer with vocab " +
                    std::to_string(written_vocab) + ", but training uses one with vocab " +
                    std::to_string(tokenizer_.vocab_size()) +
                    ". HINT: prepare the data with the model's tokenizer (titan data prepare "
                    "--tokenizer = model.hf_assets_path)");
  }
  const int64_t num_docs = source_->size();
  if (shuffle_seed_ >= 0) {
    spans_ = source_->span_starts();
  }
  num_local_docs_ = num_docs > dp_rank_ ? (num_docs - dp_rank_ + dp_world_ - 1) / dp_world_ : 0;
  if (infinite_ && num_local_docs_ == 0) {
    throw DataError("DataLoader: the dataset has " + std::to_string(num_docs) +
                    " documents, so dp rank " + std::to_string(dp_rank_) + " of " +
                    std::to_string(dp_world_) +
                    " gets none. HINT: use a larger dataset or fewer data-parallel ranks");
  }
}

std::optional<Batch> DataLoader::next() {
  const int64_t window = seq_len_ + 1;
  at::Tensor windows = at::empty({batch_size_, window}, at::kLong);  // (batch_size, seq_len + 1)
  int64_t* data = windows.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_size_; ++b) {
    if (!fill_window(data + b * window)) {
      return std::nullopt;  // drop_last: a partial batch is never returned
    }
  }
  Batch batch;
  batch.inputs = windows.slice(/*dim=*/1, /*start=*/0, /*end=*/seq_len_).contiguous();
  batch.labels = windows.slice(/*dim=*/1, /*start=*/1, /*end=*/window).contiguous();
  return batch;
}

bool DataLoader::fill_window(int64_t* out) {
  const auto window = static_cast<size_t>(seq_len_ + 1);
  while (buffer_.size() < window) {
    if (!doc_loaded_) {
      if (doc_index_ == num_local_docs_) {
        if (!infinite_) {
          return false;
        }
        ++epoch_;
        doc_index_ = 0;
        log_warning("DataLoader (dp rank ", dp_rank_, "/", dp_world_, "): dataset is being ",
                    "re-looped after ", num_local_docs_, " documents; starting epoch ", epoch_);
      }
      load_current_document();
    }
    const size_t take =
        std::min(window - buffer_.size(), doc_tokens_.size() - static_cast<size_t>(token_offset_));
    const auto first = doc_tokens_.begin() + token_offset_;
    buffer_.insert(buffer_.end(), first, first + static_cast<std::ptrdiff_t>(take));
    token_offset_ += static_cast<int64_t>(take);
    if (token_offset_ == static_cast<int64_t>(doc_tokens_.size())) {
      ++doc_index_;
      token_offset_ = 0;
      doc_loaded_ = false;
      doc_tokens_.clear();
    }
  }
  std::copy(buffer_.begin(), buffer_.end(), out);
  buffer_.clear();
  return true;
}

int64_t DataLoader::current_source_index() {
  const int64_t position = dp_rank_ + doc_index_ * dp_world_;
  if (shuffle_seed_ < 0) {
    return position;
  }
  if (order_epoch_ != epoch_) {
    order_ =
        shuffled_span_order(spans_, source_->size(), static_cast<uint64_t>(shuffle_seed_ + epoch_));
    order_epoch_ = epoch_;
  }
  return order_[position];
}

void DataLoader::load_current_document() {
  const int64_t index = current_source_index();
  std::vector<int64_t> ids = source_->encode(index, tokenizer_);
  doc_tokens_.clear();
  doc_tokens_.reserve(ids.size() + 2);
  doc_tokens_.push_back(tokenizer_.bos_id());
  doc_tokens_.insert(doc_tokens_.end(), ids.begin(), ids.end());
  doc_tokens_.push_back(tokenizer_.eos_id());
  if (token_offset_ > static_cast<int64_t>(doc_tokens_.size())) {
    throw DataError("DataLoader: saved state points at token " + std::to_string(token_offset_) +
                    " of document '" + source_->describe(index) + "', which has only " +
                    std::to_string(doc_tokens_.size()) +
                    " tokens. HINT: the dataset, tokenizer or dp layout changed since the "
                    "checkpoint was written");
  }
  doc_loaded_ = true;
}

DataLoaderState DataLoader::state() const {
  return DataLoaderState{epoch_, doc_index_, token_offset_, buffer_, shuffle_seed_};
}

nlohmann::json to_json(const DataLoaderState& state) {
  return {{"epoch", state.epoch},
          {"doc_index", state.doc_index},
          {"token_offset", state.token_offset},
          {"buffer", state.buffer},
          {"shuffle_seed", state.shuffle_seed}};
}

DataLoaderState loader_state_from_json(const nlohmann::json& j) {
  const auto fail = [&](const std::string& what) {
    throw DataError("data loader state " + j.dump().substr(0, 200) + ": " + what);
  };
  if (!j.is_object()) fail("not a JSON object");
  const auto integer = [&](const char* key) {
    if (!j.contains(key)) fail(std::string("no \"") + key + "\"");
    if (!j.at(key).is_number_integer()) fail(std::string("\"") + key + "\" is not an integer");
    return j.at(key).get<int64_t>();
  };
  DataLoaderState s;
  s.epoch = integer("epoch");
  s.doc_index = integer("doc_index");
  s.token_offset = integer("token_offset");
  s.shuffle_seed = integer("shuffle_seed");
  const bool buffer_ok =
      j.contains("buffer") && j.at("buffer").is_array() &&
      std::all_of(j.at("buffer").begin(), j.at("buffer").end(),
                  [](const nlohmann::json& id) { return id.is_number_integer(); });
  if (!buffer_ok) fail("\"buffer\" is missing or not an array of integers");
  s.buffer = j.at("buffer").get<std::vector<int64_t>>();
  return s;
}

void DataLoader::load_state(const DataLoaderState& state) {
  const auto fail = [&](const std::string& what) {
    throw DataError("DataLoader::load_state: " + what +
                    ". HINT: the checkpoint was written with another dataset, seq_len or dp "
                    "layout; resume with the same settings");
  };
  if (state.epoch < 0 || state.token_offset < 0) {
    fail("negative epoch or token offset");
  }
  if (state.doc_index < 0 || state.doc_index > num_local_docs_ ||
      (state.doc_index == num_local_docs_ && state.token_offset != 0)) {
    fail("document index " + std::to_string(state.doc_index) + " (offset " +
         std::to_string(state.token_offset) + ") does not fit this rank's " +
         std::to_string(num_local_docs_) + " documents");
  }
  if (static_cast<int64_t>(state.buffer.size()) > seq_len_) {
    fail("buffer holds " + std::to_string(state.buffer.size()) +
         " tokens, more than a partial window of seq_len + 1 = " + std::to_string(seq_len_ + 1));
  }
  const int64_t vocab = tokenizer_.vocab_size();
  for (int64_t id : state.buffer) {
    if (id < 0 || id >= vocab) {
      fail("buffer holds token id " + std::to_string(id) + " outside the vocabulary [0, " +
           std::to_string(vocab) + ")");
    }
  }
  if (state.shuffle_seed != shuffle_seed_) {
    log_warning("DataLoader::load_state: resuming with the saved document order (shuffle seed ",
                state.shuffle_seed, ") instead of the configured one (", shuffle_seed_, ")");
  }
  if (shuffle_seed_ < 0 && state.shuffle_seed >= 0) {
    spans_ = source_->span_starts();
  }
  shuffle_seed_ = state.shuffle_seed;
  order_epoch_ = -1;
  epoch_ = state.epoch;
  doc_index_ = state.doc_index;
  token_offset_ = state.token_offset;
  buffer_ = state.buffer;
  doc_tokens_.clear();
  doc_loaded_ = false;
}

}  // namespace titan
