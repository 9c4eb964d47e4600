// Packed causal-LM batches with TorchTitan's semantics (HuggingFaceDataset): every document
// becomes BOS + tokens + EOS, the documents are concatenated into one stream, and the stream is
// cut into consecutive, non-overlapping windows of seq_len + 1 tokens; a window gives
// inputs = window[:-1] and labels = window[1:]. Windows span document boundaries; no padding.
//
// Documents come from a DocumentSource, pulled one at a time as the stream reaches them, so memory
// is the source's index plus one document's tokens plus one batch (plus, when shuffling, one
// int64 per document for the epoch's order).
//
// Order: the loader loops over the documents forever (training) or once (validation). With a
// shuffle seed, epoch e visits the documents in a permutation drawn from seed + e (Fisher-Yates
// over mt19937_64, identical on every platform); without one, in source order.
// Spans: a source whose documents are decoded in spans (DocumentSource::span_starts: a compressed
// file's stretch between access points, a parquet row group) is shuffled span by span: the spans
// in a permutation drawn from seed + e, and the documents of each span in a permutation of their
// own drawn from seed + e and the span's index (shuffled_span_order), so a reader decodes each
// span once per epoch instead of once per document. A source without spans (empty span_starts)
// gets the plain permutation above. Either order is a function of the seed, the epoch and the
// source's spans alone, so a resumed loader (DataLoaderState) redraws the same order and produces
// the same batches. Data parallelism
// follows split_dataset_by_node: dp rank r reads positions i of the epoch's order with
// i % dp_world == r. Every rank draws the same permutation, so the ranks' documents are disjoint
// and together complete in every epoch.
#pragma once

#include "titan/components/data/dataset.h"
#include "titan/components/data/document_source.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace titan {

struct Batch {
  at::Tensor inputs;  // (batch_size, seq_len) int64
  at::Tensor labels;  // (batch_size, seq_len) int64, inputs shifted left by one token
  // Packed samples (sft_data.h): (batch_size, seq_len) int64 RoPE positions restarting at 0 with
  // each sample, and the sample of each token; undefined for the document stream below.
  at::Tensor positions;
  at::Tensor document_ids;
  // What conditions a model that is not a token decoder (image batches: the captions' token ids
  // for each text encoder, the samples' serial numbers), by name; each entry has a row per
  // sample, which the trainer splits over the data ranks like inputs.
  std::map<std::string, at::Tensor> conditioning;
};

// What the trainer pulls batches from: the packed document stream (DataLoader) or packed
// conversations (SftLoader), with its position as JSON for checkpoints.
class BatchLoader {
 public:
  virtual ~BatchLoader() = default;
  // The next batch, or nullopt when a finite loader is exhausted.
  virtual std::optional<Batch> next() = 0;
  virtual nlohmann::json state_json() const = 0;
  // Resumes from state_json(); DataError when the state does not fit this loader.
  virtual void load_state_json(const nlohmann::json& state) = 0;
};

// Where a DataLoader stands in its stream, for checkpoints. Positions are local to the dp rank.
struct DataLoaderState {
  int64_t epoch = 0;            // completed passes over this rank's documents
  int64_t doc_index = 0;        // this rank's document being consumed (index into its shard)
  int64_t token_offset = 0;     // tokens of that document (counting its BOS) already consumed
  std::vector<int64_t> buffer;  // tokens of the window being filled (< seq_len + 1)
  int64_t shuffle_seed = -1;    // seed of the per-epoch document order; < 0: source order

  bool operator==(const DataLoaderState& other) const {
    return epoch == other.epoch && doc_index == other.doc_index &&
           token_offset == other.token_offset && buffer == other.buffer &&
           shuffle_seed == other.shuffle_seed;
  }
};

// The state as checkpoints store it: {"epoch", "doc_index", "token_offset", "buffer",
// "shuffle_seed"}.
nlohmann::json to_json(const DataLoaderState& state);
// The inverse; DataError naming the key that is missing or not of its type (integer, or array of
// integers for "buffer").
DataLoaderState loader_state_from_json(const nlohmann::json& j);

// A permutation of [0, n) drawn from `seed`: Fisher-Yates with mt19937_64 and rejection
// sampling, so the order is the same with every standard library.
std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed);

// A permutation of [0, n) that keeps spans together: the spans (first elements `span_starts`,
// ascending from 0) in shuffled_order(#spans, seed), each span's elements in their own
// shuffled_order drawn from `seed` and the span's index. Empty `span_starts`: shuffled_order(n,
// seed). Throws DataError when the starts are not ascending from 0 below n.
std::vector<int64_t> shuffled_span_order(const std::vector<int64_t>& span_starts, int64_t n,
                                         uint64_t seed);

class DataLoader final : public BatchLoader {
 public:
  // `tokenizer` must outlive the loader. `infinite` (training) re-loops over the documents,
  // logging a warning each time; otherwise (validation) next() returns nullopt once fewer than
  // batch_size full windows remain, dropping the remainder.
  // `shuffle_seed` >= 0 shuffles the document order of each epoch (see above). A pre-tokenized
  // source must have been written by a tokenizer of the same vocab_size (DataError otherwise).
  DataLoader(std::shared_ptr<const DocumentSource> source, const Tokenizer& tokenizer,
             int64_t seq_len, int64_t batch_size, int64_t dp_rank = 0, int64_t dp_world = 1,
             bool infinite = true, int64_t shuffle_seed = -1);
  // Documents in memory, in order.
  DataLoader(std::shared_ptr<const std::vector<Document>> docs, const Tokenizer& tokenizer,
             int64_t seq_len, int64_t batch_size, int64_t dp_rank = 0, int64_t dp_world = 1,
             bool infinite = true);

  // The next batch, or nullopt when a finite loader is exhausted (and on every later call).
  std::optional<Batch> next() override;
  nlohmann::json state_json() const override { return to_json(state()); }
  void load_state_json(const nlohmann::json& state) override {
    load_state(loader_state_from_json(state));
  }

  DataLoaderState state() const;
  // Resumes from state(); the next batches equal those the saved loader would have produced,
  // given the same documents, tokenizer, seq_len and dp layout. The saved shuffle seed replaces
  // the loader's (with a warning when they differ). Throws DataError if the state does not fit.
  void load_state(const DataLoaderState& state);

  // Documents read by this dp rank.
  int64_t num_local_documents() const { return num_local_docs_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t batch_size() const { return batch_size_; }

 private:
  // Fills `out` with the next seq_len + 1 tokens; false if a finite stream ran out.
  bool fill_window(int64_t* out);
  // Makes doc_tokens_ hold BOS + tokens + EOS of local document doc_index_.
  void load_current_document();
  // Index into the source of this rank's document doc_index_ in epoch epoch_.
  int64_t current_source_index();

  std::shared_ptr<const DocumentSource> source_;
  const Tokenizer& tokenizer_;
  int64_t seq_len_;
  int64_t batch_size_;
  int64_t dp_rank_;
  int64_t dp_world_;
  bool infinite_;
  int64_t num_local_docs_;
  int64_t shuffle_seed_;
  std::vector<int64_t> spans_;  // the source's span_starts(), when shuffling
  std::vector<int64_t> order_;  // the epoch's document order, when shuffling
  int64_t order_epoch_ = -1;    // epoch that order_ was drawn for

  int64_t epoch_ = 0;
  int64_t doc_index_ = 0;
  int64_t token_offset_ = 0;
  std::vector<int64_t> buffer_;
  std::vector<int64_t> doc_tokens_;  // valid when doc_loaded_
  bool doc_loaded_ = false;
};

}  // namespace titan
