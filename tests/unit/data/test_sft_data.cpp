// Chat fine-tuning data (sft_data.h) on a byte tokenizer and a small template: which characters
// are trained (last reply to the end, earlier ones through the eos_token), the errors for
// templates and rows that do not fit the rule, the packing (positions restart, document ids,
// ignored padding), dropping/truncating/skipping with counts, shuffling and exact resume.
#include "titan/common/check.h"
#include "titan/components/data/sft_data.h"
#include "titan/kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <regex>
#include <set>

// Expects `stmt` to throw `type` with a message in which the regex `pattern` is found.
#define EXPECT_THROW_WITH(stmt, type, pattern)                                       \
  EXPECT_THROW(                                                                      \
      {                                                                              \
        try {                                                                        \
          stmt;                                                                      \
        } catch (const type& e) {                                                    \
          EXPECT_TRUE(std::regex_search(e.what(), std::regex(pattern))) << e.what(); \
          throw;                                                                     \
        }                                                                            \
      },                                                                             \
      type)

namespace titan {
namespace test_sft_data {

using ojson = nlohmann::ordered_json;

// Roles in brackets, each message ending with the eos_token "$".
const char* kTemplate =
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}${% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}";

std::shared_ptr<const ChatTemplate> make_template(const std::string& source = kTemplate) {
  return std::make_shared<const ChatTemplate>(source, "test template");
}

ChatTemplateOptions options_with_eos() {
  ChatTemplateOptions o;
  o.special_tokens = {{"eos_token", "$"}};
  return o;
}

ojson chat(std::initializer_list<std::pair<const char*, const char*>> turns) {
  ojson messages = ojson::array();
  for (const auto& [role, content] : turns)
    messages.push_back({{"role", role}, {"content", content}});
  return messages;
}

// The trained characters of the rendering, in order.
std::string trained_text(const ChatSample& s) {
  std::string out;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    if (s.trained[i]) out += static_cast<char>(s.tokens[i]);
  }
  return out;
}

TEST(ChatEncoder, TrainsEveryAssistantReplyThroughItsEnd) {
  const ByteTokenizer tok;
  const ChatEncoder enc(make_template(), options_with_eos(), tok);
  const ojson messages = chat({{"system", "be brief"},
                               {"user", "hi"},
                               {"assistant", "hello"},
                               {"user", "2+2?"},
                               {"assistant", "4"}});
  std::vector<std::pair<size_t, size_t>> spans;
  const std::string full = enc.render(messages, &spans, "row 0");
  EXPECT_EQ(full, "[system]be brief$[user]hi$[assistant]hello$[user]2+2?$[assistant]4$");
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(full.substr(spans[0].first, spans[0].second - spans[0].first), "hello$");
  EXPECT_EQ(full.substr(spans[1].first), "4$");
  EXPECT_EQ(spans[1].second, full.size());
  const ChatSample s = enc.encode(messages, "row 0");
  EXPECT_EQ(std::string(s.tokens.begin(), s.tokens.end()), full);  // bytes, nothing added
  EXPECT_EQ(trained_text(s), "hello$4$");
  EXPECT_EQ(s.trained_count(), 8);
}

TEST(ChatEncoder, RefusesWhatTheRuleCannotCut) {
  const ByteTokenizer tok;
  // The generation prompt differs from how the whole conversation renders the next turn.
  const ChatEncoder odd(make_template("{% for m in messages %}<{{ m.role }}>{{ m.content }}${% "
                                      "endfor %}{% if add_generation_prompt %}<bot>{% endif %}"
                                      "{% if not add_generation_prompt %}.{% endif %}"),
                        options_with_eos(), tok);
  const ojson two = chat({{"user", "a"}, {"assistant", "b"}});
  EXPECT_THROW_WITH(odd.encode(two, "f.jsonl:3"), DataError,
                    "f.jsonl:3: cannot tell the prompt of assistant message 1");
  // A conversation that opens with the assistant has no prompt.
  const ChatEncoder enc(make_template(), options_with_eos(), tok);
  EXPECT_THROW_WITH(enc.encode(chat({{"assistant", "x"}, {"user", "y"}}), "r"), DataError,
                    "must not open with the assistant");
  // Without an eos_token an earlier reply has no end.
  const ChatEncoder no_eos(make_template(), ChatTemplateOptions{}, tok);
  EXPECT_THROW_WITH(
      no_eos.encode(chat({{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}}),
                    "r"),
      DataError, "cannot find where assistant message 1 ends: the tokenizer config names no");
  // One reply is fine without it.
  EXPECT_EQ(trained_text(no_eos.encode(two, "r")), "b$");
}

TEST(ChatRows, MessagesQuestionAnswerAndSystemPrompt) {
  ChatRowFormat f;
  const ojson row = {{"messages", chat({{"user", "q"}, {"assistant", "a"}})}};
  EXPECT_EQ(conversation_of(row, f, "r").size(), 2u);
  f.system_prompt = "sys";
  const ojson with_system = conversation_of(row, f, "r");
  ASSERT_EQ(with_system.size(), 3u);
  EXPECT_EQ(with_system[0]["content"], "sys");
  EXPECT_EQ(
      conversation_of({{"messages", chat({{"system", "mine"}, {"user", "q"}})}}, f, "r").size(),
      2u);  // a conversation's own system message is kept, none added
  ChatRowFormat qa;
  qa.prompt_field = "question";
  qa.response_field = "answer";
  const ojson pair = conversation_of({{"question", "q?"}, {"answer", "a!"}}, qa, "r");
  EXPECT_EQ(pair[0]["role"], "user");
  EXPECT_EQ(pair[1]["content"], "a!");
  EXPECT_THROW_WITH(conversation_of({{"question", "q?"}, {"answr", "a"}}, qa, "x.jsonl:2"),
                    DataError, "x.jsonl:2: no \"answer\" field; did you mean 'answr'");
  EXPECT_THROW_WITH(conversation_of({{"msgs", 1}}, ChatRowFormat{}, "r"), DataError,
                    "no \"messages\" field.*HINT: set sft.messages_field");
  EXPECT_THROW_WITH(conversation_of({{"messages", ojson::array()}}, ChatRowFormat{}, "r"),
                    DataError, "non-empty list of messages, got an empty list");
  EXPECT_THROW_WITH(conversation_of({{"messages", {{{"content", "x"}}}}}, ChatRowFormat{}, "r"),
                    DataError, "message 0 must be an object with a string \"role\"");
  EXPECT_THROW_WITH(overlong_from_name("dorp", "sft.overlong"), ConfigError, "did you mean 'drop'");
}

std::shared_ptr<const RecordSource> rows_of(const std::vector<ojson>& conversations) {
  std::vector<ojson> rows;
  for (const ojson& c : conversations) rows.push_back({{"messages", c}});
  return std::make_shared<MemoryRecordSource>(rows, "mem");
}

std::vector<int64_t> row(const at::Tensor& t, int64_t r) {
  const at::Tensor x = t[r].contiguous();
  return std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
}

TEST(SftLoader, PacksWholeConversationsWithTheirOwnPositions) {
  const ByteTokenizer tok;
  const ChatEncoder enc(make_template(), options_with_eos(), tok);
  // Renderings of 21, 20 and 23 bytes ("[user]a$[assistant]b$", ...): 20, 19 and 22 positions.
  auto rows =
      rows_of({chat({{"user", "a"}, {"assistant", "b"}}), chat({{"user", ""}, {"assistant", "c"}}),
               chat({{"user", "ab"}, {"assistant", "de"}})});
  SftLoader loader(rows, ChatRowFormat{}, enc, Overlong::kDrop, /*seq_len=*/40, /*batch_size=*/2,
                   /*pad_id=*/0, /*infinite=*/false);
  const std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  // Window 0: samples 0 and 1, then 1 position of padding; window 1: sample 2 and 18 of padding.
  const std::vector<int64_t> pos = row(batch->positions, 0), doc = row(batch->document_ids, 0);
  const std::vector<int64_t> labels = row(batch->labels, 0), inputs = row(batch->inputs, 0);
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(pos[i], i);
  for (int64_t i = 0; i < 19; ++i) EXPECT_EQ(pos[20 + i], i);
  EXPECT_EQ(doc[0], 0);
  EXPECT_EQ(doc[19], 0);
  EXPECT_EQ(doc[20], 1);
  EXPECT_EQ(doc[39], 2);  // the padding is a document of its own
  const std::string first = "[user]a$[assistant]b$";
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(inputs[i], first[i]);
  // Labels: the next byte where it is trained ("b$", from byte 19), else ignored.
  for (int64_t i = 0; i < 20; ++i) {
    EXPECT_EQ(labels[i], i + 1 >= 19 ? first[i + 1] : kernels::kIgnoreIndex) << i;
  }
  EXPECT_EQ(labels[39], kernels::kIgnoreIndex);
  EXPECT_EQ(row(batch->positions, 1)[0], 0);
  EXPECT_EQ(row(batch->positions, 1)[22], 0);  // padding positions restart too
  EXPECT_EQ(loader.counts().conversations, 3);
  EXPECT_EQ(loader.counts().windows, 2);
  EXPECT_EQ(loader.counts().trained_tokens, 2 + 2 + 3);
  EXPECT_EQ(loader.counts().padding, 1 + 18);
  EXPECT_FALSE(loader.next().has_value());  // finite: nothing left
}

TEST(SftLoader, DropsTruncatesAndSkipsWithCounts) {
  const ByteTokenizer tok;
  const ChatEncoder enc(make_template(), options_with_eos(), tok);
  auto rows = rows_of({chat({{"user", "a"}, {"assistant", "b"}}),
                       chat({{"user", "a long question"}, {"assistant", "a long answer"}}),
                       chat({{"user", "no reply"}})});
  SftLoader drop(rows, ChatRowFormat{}, enc, Overlong::kDrop, 20, 1, 0, /*infinite=*/false);
  EXPECT_TRUE(drop.next().has_value());
  EXPECT_FALSE(drop.next().has_value());
  EXPECT_EQ(drop.counts().conversations, 1);
  EXPECT_EQ(drop.counts().dropped, 1);
  EXPECT_EQ(drop.counts().untrained, 1);
  // Truncated to 20 positions, the long one keeps nothing trained: counted as dropped too. At
  // 36 it keeps part of its reply.
  SftLoader cut(rows, ChatRowFormat{}, enc, Overlong::kTruncate, 36, 1, 0, /*infinite=*/false);
  EXPECT_TRUE(cut.next().has_value());
  const std::optional<Batch> second = cut.next();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(cut.counts().truncated, 1);
  const std::vector<int64_t> labels = row(second->labels, 0);
  EXPECT_EQ(labels.back(), 'o');  // "[user]a long question$[assistant]a lo|ng answer$"
  // No usable row at all: an error, not an endless loop.
  SftLoader none(rows_of({chat({{"user", "x"}})}), ChatRowFormat{}, enc, Overlong::kDrop, 20, 1, 0,
                 /*infinite=*/true);
  EXPECT_THROW_WITH(none.next(), DataError, "no conversation of its 1 rows can be trained");
}

TEST(SftLoader, ShufflesEachEpochAndResumesExactly) {
  const ByteTokenizer tok;
  const ChatEncoder enc(make_template(), options_with_eos(), tok);
  std::vector<ojson> convs;
  for (int i = 0; i < 9; ++i) {
    convs.push_back(chat({{"user", "q"}, {"assistant", std::string(1 + i % 4, 'a' + i).c_str()}}));
  }
  auto rows = rows_of(convs);
  SftLoader a(rows, ChatRowFormat{}, enc, Overlong::kDrop, 40, 2, 0, true, /*shuffle_seed=*/5);
  for (int i = 0; i < 3; ++i) a.next();
  const nlohmann::json state = a.state_json();
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 6; ++i) expected.push_back(a.next()->inputs);  // crosses into epoch 1+
  SftLoader b(rows, ChatRowFormat{}, enc, Overlong::kDrop, 40, 2, 0, true, 5);
  b.load_state_json(state);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(at::equal(b.next()->inputs, expected[i])) << i;
  EXPECT_EQ(b.counts().conversations, a.counts().conversations);
  // Every row is placed once per epoch: 9 conversations after the first epoch ends.
  SftLoader c(rows, ChatRowFormat{}, enc, Overlong::kDrop, 40, 1, 0, true, 5);
  while (c.counts().conversations < 9) c.next();
  EXPECT_EQ(c.counts().conversations, 9);
  // A state from another dataset size, or from the document stream, is refused.
  SftLoader small(rows_of({convs[0]}), ChatRowFormat{}, enc, Overlong::kDrop, 40, 2, 0, true, 5);
  EXPECT_THROW_WITH(small.load_state_json(state), DataError, "written for 9 rows");
  EXPECT_THROW_WITH(small.load_state_json(nlohmann::json{{"epoch", 0}}), DataError,
                    "not a chat \\(sft\\) loader's state");
}

}  // namespace test_sft_data
}  // namespace titan
