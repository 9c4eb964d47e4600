// Parquet files through Apache Arrow's C++ reader (the libraries of the pyarrow wheel; see
// CMakeLists.txt): spans are row groups. A text source reads only its text column; a record
// source reads every column and converts each row's values to JSON. See row_file.h.
//
// This file is compiled outside the unity batches (CMakeLists.txt), so Arrow's headers meet no
// other source's names.
#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/common/format.h"
#include "titan/common/names.h"
#include "titan/components/data/row_file.h"
#include "titan/components/tokenizer/unicode.h"

#if TITAN_HAS_PARQUET
#include <arrow/array.h>
#include <arrow/io/file.h>
#include <arrow/memory_pool.h>
#include <arrow/record_batch.h>
#include <arrow/scalar.h>
#include <arrow/table.h>
#include <arrow/type.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>
#endif

#include <algorithm>
#include <mutex>
#include <string_view>

namespace titan {

#if TITAN_HAS_PARQUET

namespace {

bool is_string_type(arrow::Type::type id) {
  return id == arrow::Type::STRING || id == arrow::Type::LARGE_STRING ||
         id == arrow::Type::STRING_VIEW;
}

std::string_view string_at(const arrow::Array& array, int64_t i) {
  switch (array.type_id()) {
    case arrow::Type::STRING: return static_cast<const arrow::StringArray&>(array).GetView(i);
    case arrow::Type::LARGE_STRING:
      return static_cast<const arrow::LargeStringArray&>(array).GetView(i);
    case arrow::Type::STRING_VIEW:
      return static_cast<const arrow::StringViewArray&>(array).GetView(i);
    case arrow::Type::BINARY: return static_cast<const arrow::BinaryArray&>(array).GetView(i);
    case arrow::Type::LARGE_BINARY:
      return static_cast<const arrow::LargeBinaryArray&>(array).GetView(i);
    default: break;
  }
  TITAN_CHECK(false, "string_at: not a string array: ", array.type()->ToString());
  return {};
}

template <typename ArrayType>
nlohmann::ordered_json number_at(const arrow::Array& array, int64_t i) {
  return static_cast<const ArrayType&>(array).Value(i);
}

template <typename ListType>
nlohmann::ordered_json list_at(const arrow::Array& array, int64_t i);

// Value i of `array` as JSON: null, booleans, integers, floats, strings (binary as its bytes),
// lists, structs (objects), maps (objects when the keys are strings, else [key, value] pairs),
// dictionary-encoded values as their value; other types (dates, decimals, ...) as Arrow prints
// them.
nlohmann::ordered_json value_at(const arrow::Array& array, int64_t i) {
  if (array.IsNull(i)) return nullptr;
  switch (array.type_id()) {
    case arrow::Type::NA: return nullptr;
    case arrow::Type::BOOL: return static_cast<const arrow::BooleanArray&>(array).Value(i);
    case arrow::Type::INT8: return number_at<arrow::Int8Array>(array, i);
    case arrow::Type::INT16: return number_at<arrow::Int16Array>(array, i);
    case arrow::Type::INT32: return number_at<arrow::Int32Array>(array, i);
    case arrow::Type::INT64: return number_at<arrow::Int64Array>(array, i);
    case arrow::Type::UINT8: return number_at<arrow::UInt8Array>(array, i);
    case arrow::Type::UINT16: return number_at<arrow::UInt16Array>(array, i);
    case arrow::Type::UINT32: return number_at<arrow::UInt32Array>(array, i);
    case arrow::Type::UINT64: return number_at<arrow::UInt64Array>(array, i);
    case arrow::Type::FLOAT: return number_at<arrow::FloatArray>(array, i);
    case arrow::Type::DOUBLE: return number_at<arrow::DoubleArray>(array, i);
    case arrow::Type::STRING:
    case arrow::Type::LARGE_STRING:
    case arrow::Type::STRING_VIEW:
    case arrow::Type::BINARY:
    case arrow::Type::LARGE_BINARY: return std::string(string_at(array, i));
    case arrow::Type::LIST: return list_at<arrow::ListArray>(array, i);
    case arrow::Type::LARGE_LIST: return list_at<arrow::LargeListArray>(array, i);
    case arrow::Type::FIXED_SIZE_LIST: return list_at<arrow::FixedSizeListArray>(array, i);
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(array);
      nlohmann::ordered_json object = nlohmann::ordered_json::object();
      for (int k = 0; k < s.num_fields(); ++k) {
        object[s.struct_type()->field(k)->name()] = value_at(*s.field(k), i);
      }
      return object;
    }
    case arrow::Type::MAP: {
      const auto& m = static_cast<const arrow::MapArray&>(array);
      const int64_t begin = m.value_offset(i);
      const int64_t end = begin + m.value_length(i);
      const bool string_keys = is_string_type(m.keys()->type_id());
      nlohmann::ordered_json out =
          string_keys ? nlohmann::ordered_json::object() : nlohmann::ordered_json::array();
      for (int64_t j = begin; j < end; ++j) {
        if (string_keys) {
          out[std::string(string_at(*m.keys(), j))] = value_at(*m.items(), j);
        } else {
          out.push_back(
              nlohmann::ordered_json::array({value_at(*m.keys(), j), value_at(*m.items(), j)}));
        }
      }
      return out;
    }
    case arrow::Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(array);
      return value_at(*d.dictionary(), d.GetValueIndex(i));
    }
    default: break;
  }
  const auto scalar = array.GetScalar(i);
  return scalar.ok() ? nlohmann::ordered_json((*scalar)->ToString()) : nlohmann::ordered_json();
}

template <typename ListType>
nlohmann::ordered_json list_at(const arrow::Array& array, int64_t i) {
  const auto& list = static_cast<const ListType&>(array);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  const int64_t begin = list.value_offset(i);
  const int64_t end = begin + list.value_length(i);
  for (int64_t j = begin; j < end; ++j) out.push_back(value_at(*list.values(), j));
  return out;
}

class ParquetFile final : public RowFile {
 public:
  ParquetFile(std::string path, const RowFileOptions& options)
      : path_(std::move(path)), options_(options) {
    parquet::ReaderProperties properties = parquet::default_reader_properties();
    properties.set_page_checksum_verification(true);  // pages written with checksums
    parquet::arrow::FileReaderBuilder builder;
    check(builder.OpenFile(path_, /*memory_map=*/false, properties), "cannot open");
    auto built = builder.Build();
    check(built.status(), "cannot open");
    reader_ = std::move(*built);
    std::shared_ptr<arrow::Schema> schema;
    check(reader_->GetSchema(&schema), "cannot read the schema");
    names_ = schema->field_names();
    if (options_.mode == RowMode::kText) {
      const int field = schema->GetFieldIndex(options_.text_field);
      if (field < 0) {
        throw DataError(message(
            path_, ": no column \"", options_.text_field, "\"; the columns are ", join(names_), ".",
            did_you_mean(likely_name(options_.text_field, names_)), " HINT: set ",
            options_.settings.text_field, " to the column that holds the text"));
      }
      const auto& type = schema->field(field)->type();
      if (!is_string_type(type->id())) {
        throw DataError(message(path_, ": column \"", options_.text_field, "\" is of type ",
                                type->ToString(), ", not a string. HINT: set ",
                                options_.settings.text_field,
                                " to a string column; the columns are ", join(names_)));
      }
      auto leaves = reader_->manifest().GetFieldIndices({field});
      check(leaves.status(), "cannot map the text column");
      columns_ = *leaves;
    }
    const std::shared_ptr<parquet::FileMetaData> metadata = reader_->parquet_reader()->metadata();
    int64_t total = 0;
    for (int g = 0; g < metadata->num_row_groups(); ++g) {
      starts_.push_back(total);
      total += metadata->RowGroup(g)->num_rows();
    }
    rows_ = total;
    validate();
  }

  int64_t size() const override { return rows_; }
  std::vector<int64_t> span_starts() const override { return starts_; }
  std::string describe(int64_t row) const override { return path_ + " row " + std::to_string(row); }

  std::string text(int64_t row) const override {
    const auto [table, local] = group_of(row);
    if (options_.mode != RowMode::kText) {
      const nlohmann::ordered_json value = record(row);
      auto it = value.find(options_.text_field);
      if (it == value.end() || !it->is_string()) {
        throw DataError(describe(row) + ": no string column \"" + options_.text_field + "\"");
      }
      return it->get<std::string>();
    }
    const arrow::Array& column = *table->column(0);
    return std::string(string_at(column, local));
  }

  nlohmann::ordered_json record(int64_t row) const override {
    const auto [table, local] = group_of(row);
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (int c = 0; c < table->num_columns(); ++c) {
      object[table->schema()->field(c)->name()] = value_at(*table->column(c), local);
    }
    return object;
  }

 private:
  [[noreturn]] void fail(const std::string& what, std::string detail) const {
    while (!detail.empty() && (detail.back() == '.' || detail.back() == '\n')) detail.pop_back();
    throw DataError(message(path_, ": ", what, ": ", detail,
                            ". HINT: the file is not a parquet file or is damaged; check it with "
                            "pyarrow (pyarrow.parquet.read_table) and download or write it again"));
  }
  void check(const arrow::Status& status, const std::string& what) const {
    if (!status.ok()) fail(what, status.ToString());
  }

  // Row group g, the columns this source needs, as one batch.
  std::shared_ptr<arrow::RecordBatch> read_group(int g) const {
    const std::string what = "cannot read row group " + std::to_string(g) + " (rows " +
                             std::to_string(starts_[g]) + "...)";
    try {
      auto table = options_.mode == RowMode::kText ? reader_->ReadRowGroup(g, columns_)
                                                   : reader_->ReadRowGroup(g);
      check(table.status(), what);
      auto combined = (*table)->CombineChunksToBatch();
      check(combined.status(), what);
      return *combined;
    } catch (const DataError&) {
      throw;
    } catch (const std::exception& e) {  // parquet::ParquetException from the decoders
      fail(what, e.what());
    }
  }

  // Reads every row group once: decoding errors, nulls and invalid UTF-8 in the text column
  // fail here, at start.
  void validate() {
    bool any_text = false;
    for (size_t g = 0; g < starts_.size(); ++g) {
      const std::shared_ptr<arrow::RecordBatch> table = read_group(static_cast<int>(g));
      if (options_.mode != RowMode::kText) continue;
      const arrow::Array& column = *table->column(0);
      for (int64_t r = 0; r < column.length(); ++r) {
        const std::string where = describe(starts_[g] + r);
        if (column.IsNull(r)) {
          throw DataError(where + ": column \"" + options_.text_field + "\" is null");
        }
        const std::string_view text = string_at(column, r);
        const size_t bad = find_invalid_utf8(text);
        if (bad != std::string_view::npos) {
          throw DataError(message(where, ": column \"", options_.text_field,
                                  "\" holds invalid UTF-8 at byte ", bad,
                                  " of the value; text corpora must be UTF-8"));
        }
        any_text |= !text.empty();
      }
    }
    if (options_.mode == RowMode::kText && !any_text && rows_ > 0) {
      throw DataError(path_ + ": every row's \"" + options_.text_field + "\" is empty; the " +
                      "file holds no text. HINT: check " + options_.settings.text_field +
                      ", or remove the file");
    }
    if (rows_ == 0) {
      throw DataError(path_ + ": no rows. HINT: remove it");
    }
  }

  std::pair<std::shared_ptr<arrow::RecordBatch>, int64_t> group_of(int64_t row) const {
    TITAN_CHECK(row >= 0 && row < rows_, path_, ": row ", row, " out of range");
    const auto g =
        static_cast<int>(std::upper_bound(starts_.begin(), starts_.end(), row) - starts_.begin()) -
        1;
    std::lock_guard<std::mutex> lock(mutex_);  // the reader is not thread-safe
    if (cached_group_ != g) {
      cached_ = read_group(g);
      cached_group_ = g;
    }
    return {cached_, row - starts_[g]};
  }

  std::string path_;
  RowFileOptions options_;
  std::unique_ptr<parquet::arrow::FileReader> reader_;
  std::vector<std::string> names_;
  std::vector<int> columns_;     // kText: the leaf columns of the text field
  std::vector<int64_t> starts_;  // first row of each row group
  int64_t rows_ = 0;
  mutable std::mutex mutex_;
  mutable int cached_group_ = -1;
  mutable std::shared_ptr<arrow::RecordBatch> cached_;
};

}  // namespace

std::unique_ptr<RowFile> open_parquet_file(const std::string& path, const RowFileOptions& options) {
  require_regular_file(path, "dataset file");
  return std::make_unique<ParquetFile>(path, options);
}

#else  // built with TITAN_PARQUET=OFF

std::unique_ptr<RowFile> open_parquet_file(const std::string& path, const RowFileOptions&) {
  throw ConfigError(message(path,
                            ": this titan was built without parquet support (CMake "
                            "option TITAN_PARQUET=OFF, no pyarrow when it was configured). "
                            "HINT: rebuild with -DTITAN_PARQUET=ON and the project's Python "
                            "environment, or convert the data to JSON lines"));
}

#endif

}  // namespace titan
