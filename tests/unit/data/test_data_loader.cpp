// Packed data loader: exact windows on synthetic documents (shift, BOS/EOS, cross-document
// windows, no padding), dp split, re-looping, drop-last in finite mode, and state/resume.
#include "titan/common/check.h"
#include "titan/components/data/data_loader.h"

#include "../test_util.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_data_loader {

constexpr int64_t B = ByteTokenizer::kBosId;
constexpr int64_t E = ByteTokenizer::kEosId;

std::shared_ptr<const std::vector<Document>> make_docs(const std::vector<std::string>& texts) {
  auto docs = std::make_shared<std::vector<Document>>();
  for (size_t i = 0; i < texts.size(); ++i) {
    docs->push_back(Document{"doc" + std::to_string(i), texts[i]});
  }
  return docs;
}

std::vector<int64_t> row(const at::Tensor& t, int64_t r) {
  at::Tensor x = t[r].contiguous();
  return std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
}

// Windows (seq_len + 1 tokens each) of a batch, rebuilt from inputs and the last label.
std::vector<std::vector<int64_t>> windows_of(const Batch& batch) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < batch.inputs.size(0); ++r) {
    std::vector<int64_t> w = row(batch.inputs, r);
    w.push_back(row(batch.labels, r).back());
    out.push_back(w);
  }
  return out;
}

void expect_equal(const Batch& a, const Batch& b) {
  EXPECT_TRUE(at::equal(a.inputs, b.inputs));
  EXPECT_TRUE(at::equal(a.labels, b.labels));
}

TEST(DataLoader, PacksDocumentsIntoShiftedWindows) {
  ByteTokenizer tok;
  // Stream: B a b E | B c d e E | B f E = 12 tokens = 3 windows of seq_len + 1 = 4.
  DataLoader loader(make_docs({"ab", "cde", "f"}), tok, /*seq_len=*/3, /*batch_size=*/3,
                    /*dp_rank=*/0, /*dp_world=*/1, /*infinite=*/false);
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->inputs.sizes(), (at::IntArrayRef{3, 3}));
  EXPECT_EQ(batch->labels.sizes(), (at::IntArrayRef{3, 3}));
  EXPECT_EQ(batch->inputs.scalar_type(), at::kLong);
  EXPECT_TRUE(batch->inputs.is_contiguous());
  EXPECT_TRUE(batch->labels.is_contiguous());

  EXPECT_EQ(row(batch->inputs, 0), (std::vector<int64_t>{B, 'a', 'b'}));
  EXPECT_EQ(row(batch->labels, 0), (std::vector<int64_t>{'a', 'b', E}));
  EXPECT_EQ(row(batch->inputs, 1), (std::vector<int64_t>{B, 'c', 'd'}));
  EXPECT_EQ(row(batch->labels, 1), (std::vector<int64_t>{'c', 'd', 'e'}));
  // The third window spans the end of "cde" and all of "f".
  EXPECT_EQ(row(batch->inputs, 2), (std::vector<int64_t>{E, B, 'f'}));
  EXPECT_EQ(row(batch->labels, 2), (std::vector<int64_t>{B, 'f', E}));
  EXPECT_FALSE(loader.next().has_value());
}

TEST(DataLoader, WindowsDoNotOverlap) {
  ByteTokenizer tok;
  // Stream: B h e l l o w o r l d E (12 tokens); seq_len 2 -> windows of 3.
  DataLoader loader(make_docs({"helloworld"}), tok, /*seq_len=*/2, /*batch_size=*/1,
                    /*dp_rank=*/0, /*dp_world=*/1, /*infinite=*/false);
  std::vector<int64_t> stream;
  while (std::optional<Batch> batch = loader.next()) {
    for (const auto& w : windows_of(*batch)) {
      stream.insert(stream.end(), w.begin(), w.end());
    }
  }
  std::vector<int64_t> expected{B};
  for (char c : std::string("helloworld")) {
    expected.push_back(c);
  }
  expected.push_back(E);
  EXPECT_EQ(stream, expected);
}

TEST(DataLoader, FiniteModeDropsIncompleteBatch) {
  ByteTokenizer tok;
  // 12 tokens = 3 windows of 4; batches of 2 -> one batch, the third window is dropped.
  DataLoader loader(make_docs({"ab", "cde", "f"}), tok, /*seq_len=*/3, /*batch_size=*/2,
                    /*dp_rank=*/0, /*dp_world=*/1, /*infinite=*/false);
  ASSERT_TRUE(loader.next().has_value());
  EXPECT_FALSE(loader.next().has_value());
  EXPECT_FALSE(loader.next().has_value());

  // 13 tokens -> 3 full windows and one leftover token that is never padded into a window.
  DataLoader leftover(make_docs({"ab", "cde", "fg"}), tok, /*seq_len=*/3, /*batch_size=*/1,
                      /*dp_rank=*/0, /*dp_world=*/1, /*infinite=*/false);
  int batches = 0;
  while (leftover.next()) {
    ++batches;
  }
  EXPECT_EQ(batches, 3);
}

TEST(DataLoader, InfiniteModeReloopsAndKeepsThePartialWindow) {
  ByteTokenizer tok;
  // One epoch is B x y E (4 tokens); windows of 6 straddle epochs.
  DataLoader loader(make_docs({"xy"}), tok, /*seq_len=*/5, /*batch_size=*/1);
  std::optional<Batch> first = loader.next();
  std::optional<Batch> second = loader.next();
  std::optional<Batch> third = loader.next();
  ASSERT_TRUE(first && second && third);
  EXPECT_EQ(windows_of(*first)[0], (std::vector<int64_t>{B, 'x', 'y', E, B, 'x'}));
  EXPECT_EQ(windows_of(*second)[0], (std::vector<int64_t>{'y', E, B, 'x', 'y', E}));
  EXPECT_EQ(windows_of(*third)[0], (std::vector<int64_t>{B, 'x', 'y', E, B, 'x'}));
  EXPECT_EQ(loader.state().epoch, 4);  // 18 tokens = 4.5 passes
}

TEST(DataLoader, DataParallelRanksReadDisjointDocuments) {
  ByteTokenizer tok;
  const std::vector<std::string> texts{"aa", "bb", "cc", "dd", "ee"};
  std::string seen;
  for (int64_t rank = 0; rank < 2; ++rank) {
    // Even-length stream per document, windows of 2: every token comes back.
    DataLoader loader(make_docs(texts), tok, /*seq_len=*/1, /*batch_size=*/1, rank,
                      /*dp_world=*/2, /*infinite=*/false);
    EXPECT_EQ(loader.num_local_documents(), rank == 0 ? 3 : 2);
    std::vector<int64_t> stream;
    while (std::optional<Batch> batch = loader.next()) {
      for (const auto& w : windows_of(*batch)) {
        stream.insert(stream.end(), w.begin(), w.end());
      }
    }
    const std::string text = tok.decode(stream);
    EXPECT_EQ(text, rank == 0 ? "aaccee" : "bbdd");
    seen += text;
  }
  EXPECT_EQ(seen.size(), 10u);
}

TEST(DataLoader, RejectsBadArguments) {
  ByteTokenizer tok;
  EXPECT_THROW(DataLoader(make_docs({"a"}), tok, /*seq_len=*/0, /*batch_size=*/1), c10::Error);
  EXPECT_THROW(DataLoader(make_docs({"a"}), tok, /*seq_len=*/4, /*batch_size=*/0), c10::Error);
  EXPECT_THROW(DataLoader(make_docs({"a"}), tok, 4, 1, /*dp_rank=*/2, /*dp_world=*/2), c10::Error);
  // An infinite loader with no documents on its rank would spin forever.
  EXPECT_THROW(DataLoader(make_docs({"a"}), tok, 4, 1, /*dp_rank=*/1, /*dp_world=*/2), DataError);
  DataLoader empty(make_docs({"a"}), tok, 4, 1, /*dp_rank=*/1, /*dp_world=*/2, /*infinite=*/false);
  EXPECT_FALSE(empty.next().has_value());
}

TEST(DataLoader, ResumesFromSavedState) {
  ByteTokenizer tok;
  auto docs = make_docs({"The quick brown fox", "jumps", "over the lazy dog.", "", "Fin"});
  for (int64_t rank = 0; rank < 2; ++rank) {
    DataLoader original(docs, tok, /*seq_len=*/7, /*batch_size=*/2, rank, /*dp_world=*/2);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(original.next());
    }
    const DataLoaderState saved = original.state();
    std::vector<Batch> expected;
    for (int i = 0; i < 6; ++i) {  // enough to cross at least one re-loop
      expected.push_back(*original.next());
    }
    EXPECT_GT(original.state().epoch, saved.epoch);

    DataLoader resumed(docs, tok, /*seq_len=*/7, /*batch_size=*/2, rank, /*dp_world=*/2);
    resumed.load_state(saved);
    EXPECT_EQ(resumed.state(), saved);
    for (const Batch& want : expected) {
      std::optional<Batch> got = resumed.next();
      ASSERT_TRUE(got.has_value());
      expect_equal(*got, want);
    }
    EXPECT_EQ(resumed.state(), original.state());
  }
}

TEST(DataLoader, StatePointsInsideTheCurrentDocument) {
  ByteTokenizer tok;
  DataLoader loader(make_docs({"abcdefghij", "k"}), tok, /*seq_len=*/3, /*batch_size=*/1);
  ASSERT_TRUE(loader.next());
  const DataLoaderState state = loader.state();
  EXPECT_EQ(state.epoch, 0);
  EXPECT_EQ(state.doc_index, 0);
  EXPECT_EQ(state.token_offset, 4);  // B a b c consumed
  EXPECT_TRUE(state.buffer.empty());
}

TEST(DataLoader, ResumeFromPartialBufferState) {
  ByteTokenizer tok;
  // A state whose buffer holds part of a window, as a checkpoint may carry.
  DataLoader loader(make_docs({"ab", "cd"}), tok, /*seq_len=*/3, /*batch_size=*/1);
  loader.load_state(DataLoaderState{/*epoch=*/0, /*doc_index=*/1, /*token_offset=*/2, {'z'}});
  std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch);
  EXPECT_EQ(windows_of(*batch)[0], (std::vector<int64_t>{'z', 'd', E, B}));
  EXPECT_EQ(loader.state().epoch, 1);
}

TEST(DataLoader, LoadStateRejectsMismatchedState) {
  ByteTokenizer tok;
  DataLoader loader(make_docs({"ab", "cd"}), tok, /*seq_len=*/3, /*batch_size=*/1);
  EXPECT_THROW(loader.load_state(DataLoaderState{0, /*doc_index=*/3, 0, {}}), DataError);
  EXPECT_THROW(loader.load_state(DataLoaderState{0, 0, 0, {1, 2, 3, 4}}), DataError);
  EXPECT_THROW(loader.load_state(DataLoaderState{0, 0, 0, {999}}), DataError);
  // The offset is checked against the document once it is tokenized.
  loader.load_state(DataLoaderState{0, 0, /*token_offset=*/50, {}});
  EXPECT_THROW(loader.next(), DataError);
}

TEST(DataLoader, StateRoundTripsThroughJson) {
  const DataLoaderState state{/*epoch=*/2,
                              /*doc_index=*/7,
                              /*token_offset=*/3,
                              {5, 6, 7},
                              /*shuffle_seed=*/11};
  const nlohmann::json j = to_json(state);
  EXPECT_EQ(j, nlohmann::json::parse(R"({"epoch": 2, "doc_index": 7, "token_offset": 3,
                                          "buffer": [5, 6, 7], "shuffle_seed": 11})"));
  EXPECT_EQ(loader_state_from_json(j), state);
  EXPECT_EQ(loader_state_from_json(to_json(DataLoaderState{})), DataLoaderState{});

  // Malformed state is a DataError that names the key.
  const auto data_error_of = [](const nlohmann::json& bad) {
    EXPECT_THROW(loader_state_from_json(bad), DataError) << bad;
    return test::message_of([&] { loader_state_from_json(bad); });
  };
  nlohmann::json missing = j;
  missing.erase("token_offset");
  EXPECT_NE(data_error_of(missing).find("no \"token_offset\""), std::string::npos);
  nlohmann::json text = j;
  text["epoch"] = "2";
  EXPECT_NE(data_error_of(text).find("\"epoch\" is not an integer"), std::string::npos);
  for (const nlohmann::json& buffer : {nlohmann::json(5), nlohmann::json::parse("[1, 2.5]")}) {
    nlohmann::json bad = j;
    bad["buffer"] = buffer;
    EXPECT_NE(data_error_of(bad).find("\"buffer\""), std::string::npos) << buffer;
  }
  EXPECT_NE(data_error_of(nlohmann::json::array()).find("not a JSON object"), std::string::npos);
}

}  // namespace test_data_loader
}  // namespace titan
