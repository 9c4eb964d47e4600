// Parquet datasets read through Arrow's C++ reader: documents from the text column with row
// groups as spans, records with every column as JSON (lists of structs, maps, nulls), the
// Hugging Face data/{split}-NNNNN-of-NNNNN.parquet layout, and errors (missing or non-string text
// column, a corrupt file). Fixtures are written here with Arrow's C++ writer.
#if TITAN_HAS_PARQUET  // a build with TITAN_PARQUET=OFF has no parquet reader to test
#include "titan/common/check.h"
#include "titan/components/data/data_loader.h"
#include "titan/components/data/document_source.h"
#include "titan/components/data/record_source.h"

#include "../test_util.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/json/from_string.h>
#include <parquet/arrow/writer.h>

#include <gtest/gtest.h>

namespace titan {
namespace test_parquet_source {

namespace fs = std::filesystem;
using test::contains;
using test::message_of;

// Writes `table` to `path` in row groups of `group_rows` rows.
void write_parquet(const fs::path& path, const std::shared_ptr<arrow::Table>& table,
                   int64_t group_rows) {
  fs::create_directories(path.parent_path());
  auto out = arrow::io::FileOutputStream::Open(path.string());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const arrow::Status status =
      parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), *out, group_rows);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_TRUE((*out)->Close().ok());
}

std::shared_ptr<arrow::Array> from_json(const std::shared_ptr<arrow::DataType>& type,
                                        const std::string& json) {
  auto array = arrow::json::ArrayFromJSONString(type, json);
  EXPECT_TRUE(array.ok()) << array.status().ToString();
  return *array;
}

// Rows "t0".."t{n-1}" with ids, a chat column (list<struct<role, content>>) and a map.
std::shared_ptr<arrow::Table> chat_table(int n, int first = 0) {
  std::string texts = "[", ids = "[", chats = "[", maps = "[";
  for (int i = first; i < first + n; ++i) {
    const std::string sep = i == first ? "" : ",";
    texts += sep + "\"t" + std::to_string(i) + "\"";
    ids += sep + std::to_string(i);
    chats += sep + "[{\"role\": \"user\", \"content\": \"q" + std::to_string(i) +
             "\"}, {\"role\": \"assistant\", \"content\": null}]";
    maps += sep + "[[\"k\", " + std::to_string(i) + "]]";
  }
  const auto message =
      arrow::struct_({arrow::field("role", arrow::utf8()), arrow::field("content", arrow::utf8())});
  const auto schema =
      arrow::schema({arrow::field("id", arrow::int64()), arrow::field("text", arrow::utf8()),
                     arrow::field("messages", arrow::list(message)),
                     arrow::field("tags", arrow::map(arrow::utf8(), arrow::int32()))});
  return arrow::Table::Make(
      schema, {from_json(arrow::int64(), ids + "]"), from_json(arrow::utf8(), texts + "]"),
               from_json(arrow::list(message), chats + "]"),
               from_json(arrow::map(arrow::utf8(), arrow::int32()), maps + "]")});
}

class Parquet : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::fresh_test_dir("titan_test_parquet"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(Parquet, DocumentsComeFromTheTextColumnWithRowGroupsAsSpans) {
  write_parquet(dir_ / "a.parquet", chat_table(25), /*group_rows=*/10);
  const auto source = open_corpus(path("a.parquet"), CorpusFormat::kParquet);
  ASSERT_EQ(source->size(), 25);
  EXPECT_EQ(source->span_starts(), (std::vector<int64_t>{0, 10, 20}));
  EXPECT_EQ(source->text(13), "t13");
  EXPECT_EQ(source->text(2), "t2");
  EXPECT_EQ(source->describe(13), path("a.parquet") + " row 13");
  // auto finds .parquet files in a folder, in sorted order.
  write_parquet(dir_ / "b.parquet", chat_table(5, 100), 10);
  const auto both = open_corpus(dir_.string(), CorpusFormat::kAuto);
  EXPECT_EQ(both->size(), 30);
  EXPECT_EQ(both->text(27), "t102");
  EXPECT_EQ(both->span_starts(), (std::vector<int64_t>{0, 10, 20, 25}));
}

TEST_F(Parquet, RecordsConvertEveryColumnToJson) {
  write_parquet(dir_ / "a.parquet", chat_table(12), 5);
  const auto records = open_records(path("a.parquet"));
  ASSERT_EQ(records->size(), 12);
  const nlohmann::ordered_json row = records->record(7);
  EXPECT_EQ(row.dump(),
            "{\"id\":7,\"text\":\"t7\",\"messages\":[{\"role\":\"user\",\"content\":\"q7\"},"
            "{\"role\":\"assistant\",\"content\":null}],\"tags\":{\"k\":7}}");
  EXPECT_EQ(records->span_starts(), (std::vector<int64_t>{0, 5, 10}));
}

TEST_F(Parquet, HubFoldersGiveTheSplitOfTheSection) {
  write_parquet(dir_ / "data" / "train-00000-of-00002.parquet", chat_table(4), 10);
  write_parquet(dir_ / "data" / "train-00001-of-00002.parquet", chat_table(3, 4), 10);
  write_parquet(dir_ / "data" / "test-00000-of-00001.parquet", chat_table(2, 50), 10);
  EXPECT_EQ(open_corpus(dir_.string(), CorpusFormat::kParquet, "text",
                        CorpusSettings::of_section("training"))
                ->size(),
            7);
  // No validation split: the test split.
  const auto validation = open_corpus(dir_.string(), CorpusFormat::kParquet, "text",
                                      CorpusSettings::of_section("validation"));
  EXPECT_EQ(validation->text(0), "t50");
  EXPECT_EQ(open_records(dir_.string(), CorpusSettings::of_section("validation"))->size(), 2);
  fs::remove(dir_ / "data" / "test-00000-of-00001.parquet");
  const std::string msg =
      message_of([&] { open_records(dir_.string(), CorpusSettings::of_section("validation")); });
  EXPECT_TRUE(contains(msg, "holds the splits train") && contains(msg, "validation.dataset_path"))
      << msg;
}

TEST_F(Parquet, ErrorsNameTheColumnsAndTheFile) {
  write_parquet(dir_ / "a.parquet", chat_table(3), 10);
  const CorpusSettings settings = CorpusSettings::of_section("training");
  std::string msg =
      message_of([&] { open_corpus(path("a.parquet"), CorpusFormat::kParquet, "txt", settings); });
  EXPECT_TRUE(contains(msg, "no column \"txt\"") && contains(msg, "id, text, messages, tags") &&
              contains(msg, "text") && contains(msg, "training.dataset_text_field"))
      << msg;
  msg = message_of([&] { open_corpus(path("a.parquet"), CorpusFormat::kParquet, "id", settings); });
  EXPECT_TRUE(contains(msg, "column \"id\" is of type int64, not a string")) << msg;
  // Cut in half: no footer.
  std::ifstream in(path("a.parquet"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  test::write_file(dir_ / "cut.parquet", bytes.substr(0, bytes.size() / 2));
  msg = message_of([&] { open_corpus(path("cut.parquet"), CorpusFormat::kParquet); });
  EXPECT_TRUE(contains(msg, path("cut.parquet")) && contains(msg, "HINT")) << msg;
  EXPECT_THROW(open_corpus(path("cut.parquet"), CorpusFormat::kParquet), DataError);
}

}  // namespace test_parquet_source
}  // namespace titan

#endif  // TITAN_HAS_PARQUET
