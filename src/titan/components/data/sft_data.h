// Chat fine-tuning data (training.dataset = "chat"): each row's conversation is rendered with the
// model's own chat template (tokenizer/chat_template.h), tokenized, and labelled so that only the
// assistant's turns are trained; whole conversations are packed into windows of seq_len tokens,
// each with its own positions (restarting at 0) and document id (block-causal attention), the
// rest of a window padded with ignored labels.
//
// Which tokens are trained. With F the rendering of the whole conversation and, for the
// assistant message k, P_k the rendering of the messages before it with add_generation_prompt
// (a prefix of F in every template we know; DataError otherwise), the trained text of turn k
// starts at |P_k| and runs
//   - for the last assistant message: to the end of F (TorchTitan's rule for its one turn);
//   - for an earlier one: through the first eos_token after |P_k| (the end of that turn: Llama 3's
//     <|eot_id|>, Qwen3's <|im_end|>), which must come before the next assistant's prompt ends.
// F is cut at those boundaries and each piece tokenized on its own (so a token never straddles a
// prompt and a reply); nothing is added (templates write their own BOS). Input i predicts token
// i + 1, labelled -100 unless that token is trained.
//
// Packing (greedy, in the epoch's order): a sample of n tokens takes n - 1 positions; it joins the
// current window if it fits, else the window is closed (padded) and it starts the next one. A
// sample longer than seq_len is dropped or truncated (sft.overlong), and one without an assistant
// turn is skipped; both are counted and logged. Shuffling and resuming follow DataLoader's rules
// (data_loader.h): a permutation of the rows per epoch drawn from seed + epoch that keeps the
// source's spans together (shuffled_span_order); the state is the row the next window starts
// with.
#pragma once

#include "titan/components/data/data_loader.h"
#include "titan/components/data/record_source.h"
#include "titan/components/tokenizer/chat_template.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan {

// The dataset name that selects chat fine-tuning (rows read by open_records).
inline constexpr const char* kChatDataset = "chat";

// How rows become conversations.
struct ChatRowFormat {
  std::string messages_field = "messages";  // a list of {role, content, ...} objects
  // Question/answer rows (both set): a user message from prompt_field, the assistant's reply
  // from response_field; messages_field is then unused.
  std::string prompt_field;
  std::string response_field;
  // Prepended as a system message to conversations that have none ("" = nothing).
  std::string system_prompt;
};

// The conversation (a JSON list of message objects) of `row`; DataError naming `where` and the
// field when the row does not hold one.
nlohmann::ordered_json conversation_of(const nlohmann::ordered_json& row,
                                       const ChatRowFormat& format, const std::string& where);

// One tokenized conversation.
struct ChatSample {
  std::vector<int64_t> tokens;
  std::vector<uint8_t> trained;  // per token: 1 where the model learns to write it
  int64_t trained_count() const;
};

// Renders, cuts and tokenizes conversations as described above. `options` are the template
// variables (special tokens, tools, extra); add_generation_prompt is set per rendering.
class ChatEncoder {
 public:
  ChatEncoder(std::shared_ptr<const ChatTemplate> chat_template, ChatTemplateOptions options,
              const Tokenizer& tokenizer);
  // DataError naming `where` when the template rejects the conversation or renders a prompt that
  // is not a prefix of the whole conversation.
  ChatSample encode(const nlohmann::ordered_json& messages, const std::string& where) const;
  // The rendered text and the trained character ranges [begin, end) of F (for tests and tools).
  std::string render(const nlohmann::ordered_json& messages,
                     std::vector<std::pair<size_t, size_t>>* trained,
                     const std::string& where) const;

 private:
  std::shared_ptr<const ChatTemplate> template_;
  ChatTemplateOptions options_;
  const Tokenizer& tokenizer_;
  std::string eos_;  // special_tokens["eos_token"], "" when the tokenizer config has none
};

enum class Overlong { kDrop, kTruncate };

// Parses "drop" or "truncate"; ConfigError naming `key` otherwise.
Overlong overlong_from_name(const std::string& name, const std::string& key);

// Counts since the loader was built (or resumed: the counts travel in its state).
struct SftCounts {
  int64_t conversations = 0;  // placed in windows
  int64_t dropped = 0;        // longer than seq_len with Overlong::kDrop
  int64_t truncated = 0;      // longer than seq_len with Overlong::kTruncate
  int64_t untrained = 0;      // no assistant token (skipped)
  int64_t windows = 0;
  int64_t trained_tokens = 0;  // labels that are not -100
  int64_t padding = 0;         // positions of windows left empty
};

// Batches of packed conversations: Batch with positions and document_ids set.
class SftLoader final : public BatchLoader {
 public:
  // `infinite` and `shuffle_seed` as DataLoader's. The encoder must outlive the loader.
  SftLoader(std::shared_ptr<const RecordSource> rows, ChatRowFormat format,
            const ChatEncoder& encoder, Overlong overlong, int64_t seq_len, int64_t batch_size,
            int64_t pad_id, bool infinite = true, int64_t shuffle_seed = -1);

  std::optional<Batch> next() override;
  nlohmann::json state_json() const override;
  void load_state_json(const nlohmann::json& state) override;

  const SftCounts& counts() const { return counts_; }
  int64_t num_rows() const { return rows_->size(); }

 private:
  // Fills window b of the batch arrays; false if a finite loader ran out before any sample.
  bool fill_window(int64_t* inputs, int64_t* labels, int64_t* positions, int64_t* documents);
  // The row the next sample comes from, in the epoch's order.
  int64_t current_row();
  // Makes sample_ hold the usable sample at index_ (skipping and counting unusable rows);
  // false at the end of a finite epoch.
  bool load_sample();

  std::shared_ptr<const RecordSource> rows_;
  ChatRowFormat format_;
  const ChatEncoder& encoder_;
  Overlong overlong_;
  int64_t seq_len_;
  int64_t batch_size_;
  int64_t pad_id_;
  bool infinite_;
  int64_t shuffle_seed_;
  std::vector<int64_t> spans_;  // the rows' spans (decoded together), for the shuffle
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;

  int64_t epoch_ = 0;
  int64_t index_ = 0;  // position in the epoch's order of the next sample to place
  bool sample_loaded_ = false;
  std::vector<int64_t> sample_inputs_, sample_labels_;  // of the row at index_, when loaded
  int64_t epoch_placed_ = 0;                            // samples placed this epoch
  SftCounts counts_;
};

}  // namespace titan
