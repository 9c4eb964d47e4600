// Pre-tokenized token files (.bin), written by `titan data prepare` and read memory-mapped by the
// `tokens` dataset. All integers are little-endian:
//
//   offset  size            field
//   0       8               magic "TITANTOK"
//   8       4   uint32      version, 1
//   12      4   uint32      token width in bytes: 2 (uint16 ids) or 4 (uint32 ids)
//   16      8   uint64      vocab_size of the tokenizer that wrote the file (every id is below it)
//   24      8   uint64      num_tokens
//   32      8   uint64      num_documents
//   40      num_tokens * width          token ids of all documents, concatenated, without BOS/EOS
//   ...     (num_documents + 1) * 8     uint64 document offsets, in tokens: document i is
//                                       tokens [offsets[i], offsets[i + 1]); offsets[0] == 0 and
//                                       offsets[num_documents] == num_tokens
//
// The offsets follow the tokens so that a writer can stream tokens out and append the offsets
// at the end. The file size must be exactly 40 + num_tokens * width + (num_documents + 1) * 8; a
// shorter file is reported as truncated.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace titan {

constexpr char kTokenFileMagic[8] = {'T', 'I', 'T', 'A', 'N', 'T', 'O', 'K'};
constexpr uint32_t kTokenFileVersion = 1;
constexpr int64_t kTokenFileHeaderBytes = 40;

// A read-only memory mapping of one token file; the header, the offsets and every id (below
// vocab_size) are checked on open, so a corrupt shard is refused at start-up, not when a run
// reaches the bad document.
class TokenFileReader {
 public:
  // Throws DataError naming the file and the byte offset of what is wrong.
  explicit TokenFileReader(const std::string& path);
  ~TokenFileReader();
  TokenFileReader(const TokenFileReader&) = delete;
  TokenFileReader& operator=(const TokenFileReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t token_width() const { return width_; }
  // Ids of document i (0 <= i < num_documents()); throws DataError on an id >= vocab_size().
  std::vector<int64_t> document(int64_t i) const;

 private:
  uint64_t offset(int64_t i) const;
  // DataError naming the byte and document of the first id >= vocab_size, if any.
  void check_ids() const;

  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  int64_t width_ = 0;
  int64_t vocab_size_ = 0;
  int64_t num_tokens_ = 0;
  int64_t num_documents_ = 0;
  const unsigned char* tokens_ = nullptr;
  const unsigned char* offsets_ = nullptr;
};

// Streams documents into one token file. Memory: one offset per document.
class TokenFileWriter {
 public:
  // Ids must be below vocab_size; the width is 2 bytes when vocab_size <= 65536, else 4.
  TokenFileWriter(const std::string& path, int64_t vocab_size);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void add_document(const std::vector<int64_t>& ids);
  // Appends the offsets and writes the header; the file is incomplete (and unreadable) until
  // then. Throws DataError on an I/O failure.
  void finish();

  int64_t num_tokens() const { return offsets_.back(); }
  int64_t num_documents() const { return static_cast<int64_t>(offsets_.size()) - 1; }

 private:
  void write(const void* data, size_t bytes);

  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t vocab_size_;
  int64_t width_;
  std::vector<int64_t> offsets_{0};
  bool finished_ = false;
};

}  // namespace titan
