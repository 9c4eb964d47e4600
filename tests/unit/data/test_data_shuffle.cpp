// Data loader over document sources: seeded per-epoch shuffle, the dp split (disjoint and
// complete in every epoch) and resume from any saved state, mid-epoch and across epochs.
#include "titan/common/check.h"
#include "titan/components/data/data_loader.h"
#include "titan/components/data/document_source.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

namespace titan {
namespace test_data_shuffle {

namespace fs = std::filesystem;

// Single-character documents: with seq_len 2 every window is exactly one document, B c E.
std::shared_ptr<const DocumentSource> letters(int n) {
  auto docs = std::make_shared<std::vector<Document>>();
  for (int i = 0; i < n; ++i) {
    docs->push_back(Document{"d" + std::to_string(i), std::string(1, static_cast<char>('0' + i))});
  }
  return std::make_shared<MemoryDocumentSource>(docs);
}

// The documents of the next `n` one-document windows.
std::vector<char> next_docs(DataLoader& loader, int64_t n) {
  std::vector<char> out;
  for (int64_t i = 0; i < n; ++i) {
    std::optional<Batch> batch = loader.next();
    EXPECT_TRUE(batch.has_value());
    EXPECT_EQ(batch->inputs[0][0].item<int64_t>(), ByteTokenizer::kBosId);
    out.push_back(static_cast<char>(batch->inputs[0][1].item<int64_t>()));
  }
  return out;
}

std::vector<char> sorted(std::vector<char> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(ShuffledOrder, IsAPermutationFixedBySeed) {
  const std::vector<int64_t> a = shuffled_order(100, /*seed=*/5);
  std::vector<int64_t> identity(100);
  for (int64_t i = 0; i < 100; ++i) {
    identity[i] = i;
  }
  std::vector<int64_t> s = a;
  std::sort(s.begin(), s.end());
  EXPECT_EQ(s, identity);
  EXPECT_NE(a, identity);
  EXPECT_EQ(shuffled_order(100, 5), a);
  EXPECT_NE(shuffled_order(100, 6), a);
  EXPECT_TRUE(shuffled_order(0, 1).empty());
  EXPECT_EQ(shuffled_order(1, 1), (std::vector<int64_t>{0}));
}

TEST(DataLoaderShuffle, DeterministicPerSeedAndNewOrderEachEpoch) {
  ByteTokenizer tok;
  const int n = 30;
  DataLoader loader(letters(n), tok, /*seq_len=*/2, /*batch_size=*/1, 0, 1, true, /*seed=*/7);
  const std::vector<char> epoch0 = next_docs(loader, n);
  const std::vector<char> epoch1 = next_docs(loader, n);
  EXPECT_EQ(sorted(epoch0), sorted(epoch1));  // each epoch visits every document once
  EXPECT_EQ(sorted(epoch0).size(), static_cast<size_t>(n));
  EXPECT_NE(epoch0, epoch1);
  EXPECT_NE(epoch0, sorted(epoch0));
  EXPECT_EQ(loader.state().epoch, 1);

  DataLoader same(letters(n), tok, 2, 1, 0, 1, true, /*seed=*/7);
  EXPECT_EQ(next_docs(same, n), epoch0);
  EXPECT_EQ(next_docs(same, n), epoch1);
  DataLoader other(letters(n), tok, 2, 1, 0, 1, true, /*seed=*/8);
  EXPECT_NE(next_docs(other, n), epoch0);
}

TEST(DataLoaderShuffle, WithoutSeedKeepsSourceOrderEveryEpoch) {
  ByteTokenizer tok;
  DataLoader loader(letters(5), tok, 2, 1, 0, 1, /*infinite=*/true, /*shuffle_seed=*/-1);
  const std::vector<char> in_order{'0', '1', '2', '3', '4'};
  EXPECT_EQ(next_docs(loader, 5), in_order);
  EXPECT_EQ(next_docs(loader, 5), in_order);
}

TEST(DataLoaderShuffle, DataParallelSplitIsDisjointAndCompleteEachEpoch) {
  ByteTokenizer tok;
  const int n = 31;  // not a multiple of the dp degree
  const int64_t world = 3;
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int64_t r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<DataLoader>(letters(n), tok, 2, 1, r, world, true, 11));
  }
  std::vector<char> previous;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<char> all;
    std::vector<char> rank0;
    for (int64_t r = 0; r < world; ++r) {
      const std::vector<char> docs = next_docs(*ranks[r], ranks[r]->num_local_documents());
      all.insert(all.end(), docs.begin(), docs.end());
      if (r == 0) {
        rank0 = docs;
      }
    }
    const std::set<char> unique(all.begin(), all.end());
    EXPECT_EQ(all.size(), static_cast<size_t>(n)) << "epoch " << epoch;
    EXPECT_EQ(unique.size(), static_cast<size_t>(n)) << "epoch " << epoch;
    EXPECT_NE(rank0, previous) << "rank 0 reads other documents in epoch " << epoch;
    previous = rank0;
  }
}

// A JSON-lines corpus of documents of varied lengths, so windows cut documents at every offset.
class ResumeCorpus : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = fs::temp_directory_path() /
            ("titan_test_resume_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".jsonl");
    std::ofstream out(file_);
    for (int i = 0; i < 13; ++i) {
      out << "{\"text\": \"doc " << i << std::string(static_cast<size_t>(i * 3 % 11), 'x')
          << "\"}\n";
    }
  }
  void TearDown() override { fs::remove(file_); }
  fs::path file_;
};

TEST_F(ResumeCorpus, ResumeFromAnyStateReproducesTheStream) {
  ByteTokenizer tok;
  auto source = open_corpus(file_.string(), CorpusFormat::kJsonl);
  for (int64_t rank = 0; rank < 2; ++rank) {
    DataLoader reference(source, tok, /*seq_len=*/9, /*batch_size=*/2, rank, /*dp_world=*/2,
                         /*infinite=*/true, /*shuffle_seed=*/1234);
    std::vector<DataLoaderState> states;
    std::vector<Batch> batches;
    const int total = 24;
    for (int i = 0; i < total; ++i) {
      states.push_back(reference.state());
      batches.push_back(*reference.next());
    }
    ASSERT_GE(reference.state().epoch, 3) << "the run should cross several epoch boundaries";
    std::set<int64_t> saved_epochs;
    for (int k = 0; k < total; ++k) {
      saved_epochs.insert(states[k].epoch);
      EXPECT_EQ(states[k].shuffle_seed, 1234);
      // A fresh loader with another configured seed still follows the saved order.
      DataLoader resumed(source, tok, 9, 2, rank, 2, true, /*shuffle_seed=*/k % 2 ? 1234 : 99);
      resumed.load_state(states[k]);
      for (int i = k; i < total; ++i) {
        std::optional<Batch> got = resumed.next();
        ASSERT_TRUE(got.has_value());
        ASSERT_TRUE(at::equal(got->inputs, batches[i].inputs)) << "resume at " << k << ", " << i;
        ASSERT_TRUE(at::equal(got->labels, batches[i].labels)) << "resume at " << k << ", " << i;
      }
      EXPECT_EQ(resumed.state(), reference.state());
    }
    EXPECT_GE(saved_epochs.size(), 3u);  // states saved mid-epoch in several epochs
  }
}

TEST_F(ResumeCorpus, StateCarriesPositionAndSeed) {
  ByteTokenizer tok;
  auto source = open_corpus(file_.string(), CorpusFormat::kJsonl);
  DataLoader loader(source, tok, /*seq_len=*/5, /*batch_size=*/1, 0, 1, true, 3);
  ASSERT_TRUE(loader.next());
  const DataLoaderState s = loader.state();
  // A window never ends mid-fill, so the buffer is empty between batches and the position lies
  // inside a document.
  EXPECT_TRUE(s.buffer.empty());
  EXPECT_EQ(s.epoch, 0);
  EXPECT_EQ(s.shuffle_seed, 3);
  EXPECT_GT(s.token_offset + s.doc_index, 0);
}

}  // namespace test_data_shuffle
}  // namespace titan
