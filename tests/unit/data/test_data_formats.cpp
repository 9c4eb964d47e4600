// Compressed JSON lines (.jsonl.gz with one or several members, .jsonl.zst with one or several
// frames) read by row in any order, their spans, the span-aware shuffle and its resume, corrupt
// and truncated files (DataError with file and compressed offset), and the c4 dataset names
// over a c4 folder and a Hugging Face hub cache. Fixtures are written here with zlib and libzstd.
#include "titan/common/check.h"
#include "titan/components/data/c4.h"
#include "titan/components/data/data_loader.h"
#include "titan/components/data/dataset.h"
#include "titan/components/data/document_source.h"
#include "titan/components/data/record_source.h"

#include "../test_util.h"

#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <random>
#include <set>
#include <thread>

namespace titan {
namespace test_data_formats {

namespace fs = std::filesystem;
using test::contains;
using test::message_of;
using test::write_file;

// `n` JSON lines of varied, incompressible-enough text (so 3 MiB of text makes several spans).
std::vector<std::string> make_texts(int n) {
  std::mt19937 rng(7);
  const std::vector<std::string> words{"alpha", "beta", "gamma", "délta", "東京", "x", "yz"};
  std::vector<std::string> texts;
  for (int i = 0; i < n; ++i) {
    std::string text = "doc " + std::to_string(i) + ":";
    const int length = 5 + static_cast<int>(rng() % 60);
    for (int w = 0; w < length; ++w)
      text += " " + words[rng() % words.size()] + std::to_string(rng() % 1000);
    texts.push_back(text);
  }
  return texts;
}

std::string jsonl_of(const std::vector<std::string>& texts, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    out += nlohmann::ordered_json{{"text", texts[i]}, {"id", i}}.dump() + "\n";
    if (i % 97 == 0) out += "\n";  // blank lines separate nothing
  }
  return out;
}

// One gzip member holding `data`.
std::string gzip_member(const std::string& data) {
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&s, data.size()), '\0');
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  s.avail_in = static_cast<uInt>(data.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

std::string zstd_frame(const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::vector<std::string> texts_of(const DocumentSource& source, const std::vector<int64_t>& order) {
  std::vector<std::string> out;
  for (int64_t i : order) out.push_back(source.text(i));
  return out;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

class Formats : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("titan_test_formats");
    texts_ = make_texts(12000);  // ~3.5 MiB of JSON lines
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Every row in a shuffled order, then in order, equals the text written.
  void expect_all_rows(const std::string& file) {
    auto source = open_corpus(file, CorpusFormat::kJsonl);
    ASSERT_EQ(source->size(), static_cast<int64_t>(texts_.size()));
    std::vector<int64_t> order = shuffled_order(source->size(), 3);
    order.resize(200);
    std::vector<std::string> want;
    for (int64_t i : order) want.push_back(texts_[i]);
    EXPECT_EQ(texts_of(*source, order), want);
    EXPECT_EQ(texts_of(*source, iota(source->size())), texts_);
  }

  fs::path dir_;
  std::vector<std::string> texts_;
};

TEST_F(Formats, GzipIsReadByRowInAnyOrderWithSpansOfAboutOneMiB) {
  write_file(dir_ / "a.jsonl.gz", gzip_member(jsonl_of(texts_, 0, texts_.size())));
  expect_all_rows(path("a.jsonl.gz"));
  const auto source = open_corpus(path("a.jsonl.gz"), CorpusFormat::kJsonl);
  const std::vector<int64_t> spans = source->span_starts();
  EXPECT_GE(spans.size(), 3u);
  EXPECT_EQ(spans.front(), 0);
  EXPECT_TRUE(std::is_sorted(spans.begin(), spans.end()));
  // Lines are counted across blank lines, as in plain JSON lines.
  const auto plain_dir = dir_ / "plain";
  write_file(plain_dir / "a.jsonl", jsonl_of(texts_, 0, texts_.size()));
  const auto plain = open_corpus((plain_dir / "a.jsonl").string(), CorpusFormat::kJsonl);
  EXPECT_EQ(plain->span_starts(), std::vector<int64_t>{});  // every row its own span
  EXPECT_EQ(
      source->describe(5000),
      path("a.jsonl.gz") + plain->describe(5000).substr((plain_dir / "a.jsonl").string().size()));
}

TEST_F(Formats, MultiMemberGzipAndC4NamingAndAutoFormat) {
  const std::string data = jsonl_of(texts_, 0, texts_.size());
  const size_t cut = data.find('\n', data.size() / 3) + 1;
  const size_t cut2 = data.find('\n', 2 * data.size() / 3) + 1;
  write_file(dir_ / "c4-train.00000-of-00001.json.gz",
             gzip_member(data.substr(0, cut)) + gzip_member(data.substr(cut, cut2 - cut)) +
                 gzip_member(data.substr(cut2)));
  expect_all_rows(path("c4-train.00000-of-00001.json.gz"));
  // A folder in auto format finds .json.gz files.
  EXPECT_EQ(open_corpus(dir_.string(), CorpusFormat::kAuto)->size(),
            static_cast<int64_t>(texts_.size()));
}

TEST_F(Formats, ZstdOneFrameAndManyFrames) {
  const std::string data = jsonl_of(texts_, 0, texts_.size());
  write_file(dir_ / "one.jsonl.zst", zstd_frame(data));
  expect_all_rows(path("one.jsonl.zst"));
  EXPECT_EQ(open_corpus(path("one.jsonl.zst"), CorpusFormat::kJsonl)->span_starts().size(), 1u);
  // Frames of ~1.2 MiB, cut anywhere (not at line ends): a frame start is an access point.
  std::string frames;
  for (size_t at = 0; at < data.size(); at += 1200000)
    frames += zstd_frame(data.substr(at, 1200000));
  write_file(dir_ / "many.jsonl.zst", frames);
  expect_all_rows(path("many.jsonl.zst"));
  EXPECT_GE(open_corpus(path("many.jsonl.zst"), CorpusFormat::kJsonl)->span_starts().size(), 2u);
}

TEST_F(Formats, RecordsOfCompressedJsonLines) {
  write_file(dir_ / "r.jsonl.gz", gzip_member(jsonl_of(texts_, 0, 100)));
  const auto records = open_records(path("r.jsonl.gz"));
  ASSERT_EQ(records->size(), 100);
  EXPECT_EQ(records->record(42)["id"], 42);
  EXPECT_EQ(records->record(42)["text"], texts_[42]);
  // Keys keep the file's order.
  EXPECT_EQ(records->record(0).begin().key(), "text");
}

TEST_F(Formats, ConcurrentReadersGetTheirOwnRows) {
  write_file(dir_ / "a.jsonl.gz", gzip_member(jsonl_of(texts_, 0, texts_.size())));
  const auto source = open_corpus(path("a.jsonl.gz"), CorpusFormat::kJsonl);
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<int64_t> order = shuffled_order(source->size(), 10 + t);
      for (int k = 0; k < 60; ++k) bad[t] += source->text(order[k]) != texts_[order[k]];
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

TEST_F(Formats, CorruptAndTruncatedFilesNameTheFileAndOffset) {
  const std::string gz = gzip_member(jsonl_of(texts_, 0, texts_.size()));
  const std::string zst = zstd_frame(jsonl_of(texts_, 0, texts_.size()));
  write_file(dir_ / "cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  write_file(dir_ / "cut.jsonl.zst", zst.substr(0, zst.size() / 2));
  write_file(dir_ / "header.jsonl.gz", gz.substr(0, 5));
  std::string flipped = gz;
  flipped[flipped.size() - 6] ^= 1;  // the CRC-32
  write_file(dir_ / "crc.jsonl.gz", flipped);
  std::string garbage = gz;
  for (size_t i = 100; i < 400; ++i) garbage[i] = static_cast<char>(i * 7);
  write_file(dir_ / "garbage.jsonl.gz", garbage);
  write_file(dir_ / "trailing.jsonl.gz", gz + "not gzip");
  std::string bad_zst = zst;
  for (size_t i = 20; i < 300; ++i) bad_zst[i] = static_cast<char>(i * 13);
  write_file(dir_ / "garbage.jsonl.zst", bad_zst);
  for (const char* name : {"cut.jsonl.gz", "cut.jsonl.zst", "header.jsonl.gz", "crc.jsonl.gz",
                           "garbage.jsonl.gz", "trailing.jsonl.gz", "garbage.jsonl.zst"}) {
    const std::string msg = message_of([&] { open_corpus(path(name), CorpusFormat::kJsonl); });
    EXPECT_TRUE(contains(msg, path(name))) << name << ": " << msg;
    EXPECT_TRUE(contains(msg, "compressed byte offset") || contains(msg, "decompressed byte"))
        << msg;
    EXPECT_TRUE(contains(msg, "HINT")) << msg;
  }
  EXPECT_TRUE(contains(message_of([&] { open_corpus(path("cut.jsonl.gz"), CorpusFormat::kJsonl); }),
                       "truncated"));
  EXPECT_TRUE(contains(message_of([&] { open_corpus(path("crc.jsonl.gz"), CorpusFormat::kJsonl); }),
                       "incorrect data check"));
  write_file(dir_ / "empty.jsonl.gz", "");
  EXPECT_TRUE(
      contains(message_of([&] { open_corpus(path("empty.jsonl.gz"), CorpusFormat::kJsonl); }),
               "empty file"));
  // Bad JSON inside is reported by line, as in plain files.
  write_file(dir_ / "badline.jsonl.gz", gzip_member("{\"text\": \"a\"}\n{oops\n"));
  EXPECT_TRUE(
      contains(message_of([&] { open_corpus(path("badline.jsonl.gz"), CorpusFormat::kJsonl); }),
               path("badline.jsonl.gz") + ":2: malformed JSON"));
}

// A source with given spans over single-character documents.
class SpannedLetters final : public DocumentSource {
 public:
  SpannedLetters(int n, std::vector<int64_t> spans) : n_(n), spans_(std::move(spans)) {}
  int64_t size() const override { return n_; }
  std::string describe(int64_t i) const override { return "d" + std::to_string(i); }
  std::vector<int64_t> encode(int64_t i, const Tokenizer& tokenizer) const override {
    return tokenizer.encode(text(i));
  }
  std::string text(int64_t i) const override { return std::string(1, static_cast<char>('A' + i)); }
  std::vector<int64_t> span_starts() const override { return spans_; }

 private:
  int n_;
  std::vector<int64_t> spans_;
};

TEST(SpanShuffle, SpansStayTogetherAndEveryRowComesOnce) {
  const std::vector<int64_t> spans{0, 5, 6, 20, 33};
  const int64_t n = 40;
  const std::vector<int64_t> order = shuffled_span_order(spans, n, 11);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(n));
  // Each span's rows are consecutive in the order.
  const auto span_of = [&](int64_t row) {
    return std::upper_bound(spans.begin(), spans.end(), row) - spans.begin() - 1;
  };
  int changes = 0;
  for (size_t i = 1; i < order.size(); ++i) changes += span_of(order[i]) != span_of(order[i - 1]);
  EXPECT_EQ(changes, static_cast<int>(spans.size()) - 1);
  EXPECT_NE(order, iota(n));                                         // shuffled
  EXPECT_EQ(order, shuffled_span_order(spans, n, 11));               // deterministic
  EXPECT_NE(order, shuffled_span_order(spans, n, 12));               // seeded
  EXPECT_EQ(shuffled_span_order({}, n, 11), shuffled_order(n, 11));  // no spans: as before
  EXPECT_THROW(shuffled_span_order({1, 5}, n, 1), DataError);
  EXPECT_THROW(shuffled_span_order({0, 5, 5}, n, 1), DataError);
  EXPECT_THROW(shuffled_span_order({0, 40}, n, 1), DataError);
}

// The documents of the next `count` one-document windows (seq_len 2: B c E per window).
std::string next_letters(DataLoader& loader, int count) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    std::optional<Batch> batch = loader.next();
    EXPECT_TRUE(batch.has_value());
    out.push_back(static_cast<char>(batch->inputs[0][1].item<int64_t>()));
  }
  return out;
}

TEST(SpanShuffle, LoaderVisitsSpansWholeAndResumesExactly) {
  auto source = std::make_shared<SpannedLetters>(20, std::vector<int64_t>{0, 4, 9, 15});
  ByteTokenizer tok;
  DataLoader loader(source, tok, /*seq_len=*/2, /*batch_size=*/1, /*dp_rank=*/0, /*dp_world=*/1,
                    /*infinite=*/true, /*shuffle_seed=*/5);
  const std::string first = next_letters(loader, 7);
  const DataLoaderState saved = loader.state();
  const std::string rest = next_letters(loader, 40);  // into the next epochs
  // Epoch 0's letters follow shuffled_span_order.
  std::string want;
  for (int64_t i : shuffled_span_order(source->span_starts(), 20, 5)) {
    want.push_back(static_cast<char>('A' + i));
  }
  EXPECT_EQ((first + rest).substr(0, 20), want);
  DataLoader resumed(source, tok, 2, 1, 0, 1, true, 5);
  resumed.load_state(saved);
  EXPECT_EQ(next_letters(resumed, 40), rest);
}

TEST(C4, FindsShardsInAFolderItsEnFolderAndAHubCache) {
  const fs::path dir = test::fresh_test_dir("titan_test_c4");
  const std::string row = "{\"text\": \"hello c4\", \"timestamp\": \"2019\", \"url\": \"u\"}\n";
  write_file(dir / "plain" / "en" / "c4-train.00001-of-01024.json.gz", gzip_member(row + row));
  write_file(dir / "plain" / "en" / "c4-train.00000-of-01024.json.gz", gzip_member(row));
  write_file(dir / "plain" / "en" / "c4-validation.00000-of-00008.json.gz", gzip_member(row));
  write_file(dir / "plain" / "en" / "notes.txt", "not a shard");
  const std::string hub_en = "hub/datasets--allenai--c4/snapshots/0123abc/en";
  write_file(dir / hub_en / "c4-validation.00000-of-00008.json.gz", gzip_member(row));
  const CorpusSettings settings = CorpusSettings::of_section("training");

  const std::vector<std::string> train = find_c4_files((dir / "plain").string(), "train", settings);
  ASSERT_EQ(train.size(), 2u);
  EXPECT_TRUE(contains(train[0], "c4-train.00000-of-01024.json.gz"));
  EXPECT_EQ(find_c4_files((dir / "plain" / "en").string(), "train", settings), train);
  EXPECT_EQ(open_dataset("c4", (dir / "plain").string())->size(), 3);
  EXPECT_EQ(open_dataset("c4_validation", (dir / "plain").string())->text(0), "hello c4");
  for (const char* at :
       {"hub", "hub/datasets--allenai--c4", "hub/datasets--allenai--c4/snapshots/0123abc"}) {
    EXPECT_EQ(open_dataset("c4_validation", (dir / at).string())->size(), 1) << at;
  }
  // No train files in the hub cache: the message says which files, where, and which key.
  const std::string msg = message_of([&] {
    open_dataset("c4", (dir / "hub").string(), "text", CorpusSettings::of_section("training"));
  });
  EXPECT_TRUE(contains(msg, "en/c4-train")) << msg;
  EXPECT_TRUE(contains(msg, "training.dataset_path")) << msg;
  const std::string missing = message_of([&] { open_dataset("c4", (dir / "nowhere").string()); });
  EXPECT_TRUE(contains(missing, "does not exist") && contains(missing, "HINT")) << missing;
  // c4_test: TorchTitan's folder of JSON lines (data.json).
  write_file(dir / "c4_test" / "data.json", row + row + row);
  EXPECT_EQ(open_dataset("c4_test", (dir / "c4_test").string())->size(), 3);
  fs::remove_all(dir);
}

}  // namespace test_data_formats
}  // namespace titan
