// Dataset registry and manifest verification on a fake dataset folder; the real `sotu` corpus is
// checked too when scripts/fetch_sotu.sh has put it in the cache (skipped otherwise).
#include "titan/common/check.h"
#include "titan/components/data/dataset.h"
#include "titan/components/data/manifest.h"
#include "titan/components/data/sotu.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

namespace titan {
namespace test_dataset {

namespace fs = std::filesystem;
using test::contains;
using test::message_of;
using test::write_file;

// A temporary dataset folder with three small addresses and a manifest describing them.
class FakeSotu : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("titan_test_data");
    const std::vector<std::pair<std::string, std::string>> files{
        {"1795_george_washington_n.txt", "Fellow-Citizens, 1795."},
        {"1796_george_washington_n.txt", "Fellow-Citizens, 1796!"},
        {"2005_george_w_bush_r.txt", "Mr. Speaker, 2005."},
    };
    for (const auto& [name, text] : files) {
      write_file(dir_ / name, text);
      names_.push_back(name);
      texts_.push_back(text);
    }
    for (size_t i = 0; i < names_.size(); ++i) {
      manifest_.push_back(
          ManifestEntry{names_[i], static_cast<int64_t>(texts_[i].size()), fnv1a64(texts_[i])});
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::vector<std::string> names_;  // owns the strings manifest_ views
  std::vector<std::string> texts_;
  std::vector<ManifestEntry> manifest_;
};

TEST(Fnv1a64, KnownValues) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST_F(FakeSotu, ReadsVerifiedFilesInManifestOrder) {
  std::vector<Document> docs = read_verified_documents("fake", dir_, manifest_, "setup.sh");
  ASSERT_EQ(docs.size(), 3u);
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ(docs[i].name, names_[i]);
    EXPECT_EQ(docs[i].text, texts_[i]);
  }
}

TEST_F(FakeSotu, SplitsOnYearsEndingInFive) {
  std::vector<Document> train = load_sotu(dir_, SotuSplit::kTrain, manifest_);
  std::vector<Document> validation = load_sotu(dir_, SotuSplit::kValidation, manifest_);
  ASSERT_EQ(train.size(), 1u);
  EXPECT_EQ(train[0].name, "1796_george_washington_n.txt");
  ASSERT_EQ(validation.size(), 2u);
  EXPECT_EQ(validation[0].name, "1795_george_washington_n.txt");
  EXPECT_EQ(validation[1].name, "2005_george_w_bush_r.txt");
}

TEST_F(FakeSotu, DetectsCorruptedFile) {
  std::string text = texts_[1];
  text[3] ^= 0x20;  // same size, different bytes
  write_file(dir_ / names_[1], text);
  const std::string msg = message_of([&] { load_sotu(dir_, SotuSplit::kTrain, manifest_); });
  EXPECT_TRUE(contains(msg, names_[1])) << msg;
  EXPECT_TRUE(contains(msg, "hash")) << msg;
  EXPECT_TRUE(contains(msg, "scripts/setup.sh")) << msg;
  EXPECT_TRUE(contains(msg, "delete the folder")) << msg;
  EXPECT_THROW(load_sotu(dir_, SotuSplit::kTrain, manifest_), DataError);
}

TEST_F(FakeSotu, DetectsTruncatedFile) {
  write_file(dir_ / names_[0], texts_[0].substr(0, 5));
  const std::string msg = message_of([&] { load_sotu(dir_, SotuSplit::kValidation, manifest_); });
  EXPECT_TRUE(contains(msg, names_[0])) << msg;
  EXPECT_TRUE(contains(msg, "has 5 bytes")) << msg;
}

TEST_F(FakeSotu, DetectsMissingFile) {
  fs::remove(dir_ / names_[2]);
  EXPECT_THROW(load_sotu(dir_, SotuSplit::kValidation, manifest_), DataError);
  const std::string msg = message_of([&] { load_sotu(dir_, SotuSplit::kValidation, manifest_); });
  EXPECT_TRUE(contains(msg, names_[2] + " is missing")) << msg;
  // The other split does not read that file.
  EXPECT_EQ(load_sotu(dir_, SotuSplit::kTrain, manifest_).size(), 1u);
}

TEST_F(FakeSotu, MissingFolderSaysHowToFetch) {
  const std::string missing = (dir_ / "nowhere").string();
  EXPECT_THROW(load_sotu(missing, SotuSplit::kTrain, manifest_), DataError);
  const std::string msg = message_of([&] { load_dataset("sotu", missing); });
  EXPECT_EQ(msg, "dataset 'sotu' not found at " + missing + "; run scripts/setup.sh to fetch it");
}

TEST(SotuSplit, ValidationFileNames) {
  EXPECT_TRUE(is_sotu_validation_file("1795_george_washington_n.txt"));
  EXPECT_TRUE(is_sotu_validation_file("2015_barack_obama_d.txt"));
  EXPECT_FALSE(is_sotu_validation_file("1796_george_washington_n.txt"));
  EXPECT_FALSE(is_sotu_validation_file("1850_zachary_taylor_w.txt"));
  EXPECT_FALSE(is_sotu_validation_file("195"));
}

TEST(SotuManifest, Covers233AddressesInOrder) {
  const std::vector<ManifestEntry>& manifest = sotu_manifest();
  ASSERT_EQ(manifest.size(), 233u);
  int64_t validation = 0;
  for (size_t i = 0; i < manifest.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(manifest[i - 1].filename, manifest[i].filename);
    }
    validation += is_sotu_validation_file(manifest[i].filename) ? 1 : 0;
  }
  EXPECT_EQ(manifest.front().filename, "1790_george_washington_n.txt");
  EXPECT_EQ(manifest.back().filename, "2021_joseph_r_biden_d.txt");
  EXPECT_EQ(validation, 23);
}

TEST(DatasetRegistry, KnowsBuiltins) {
  const std::vector<std::string> names = dataset_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "sotu"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "sotu_validation"), names.end());
}

TEST(DatasetRegistry, UnknownNameSuggestsClosest) {
  EXPECT_THROW(load_dataset("sotu_val", ""), ConfigError);
  const std::string msg = message_of([] { load_dataset("sotu_val", ""); });
  EXPECT_TRUE(contains(msg, "unknown dataset 'sotu_val'")) << msg;
  EXPECT_TRUE(contains(msg, "did you mean 'sotu_validation'")) << msg;
  EXPECT_TRUE(contains(msg, "Known datasets: ")) << msg;
  EXPECT_TRUE(contains(message_of([] { load_dataset("sotuu", ""); }), "did you mean 'sotu'?"));
  const std::string far = message_of([] { default_dataset_path("openwebtext"); });
  EXPECT_FALSE(contains(far, "did you mean")) << far;
  EXPECT_THROW(default_dataset_path("openwebtext"), ConfigError);
}

TEST(DatasetRegistry, DefaultPathUsesTitanCache) {
  const char* old = std::getenv("TITAN_CACHE");
  const std::string saved = old ? old : "";
  setenv("TITAN_CACHE", "/some/cache", 1);
  EXPECT_EQ(default_dataset_path("sotu"), "/some/cache/datasets/sotu");
  EXPECT_EQ(default_dataset_path("sotu_validation"), "/some/cache/datasets/sotu");
  setenv("TITAN_CACHE", "", 1);  // empty counts as unset, as in the scripts
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') {
    EXPECT_EQ(default_dataset_path("sotu"), std::string(home) + "/.cache/titan/datasets/sotu");
  }
  if (old) {
    setenv("TITAN_CACHE", saved.c_str(), 1);
  } else {
    unsetenv("TITAN_CACHE");
  }
}

TEST(DatasetRegistry, RegistersNewDatasets) {
  register_dataset(
      DatasetSpec{"test_echo", "one document holding the path", "", [](const std::string& path) {
                    return std::vector<Document>{Document{"echo", path}};
                  }});
  std::vector<Document> docs = load_dataset("test_echo", "/x/y");
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].text, "/x/y");
  EXPECT_THROW(load_dataset("test_echo", ""), ConfigError);  // no default location
  EXPECT_THROW(
      register_dataset(DatasetSpec{"test_echo", "", "",
                                   [](const std::string&) { return std::vector<Document>{}; }}),
      ConfigError);
}

TEST(SotuCorpus, RealCorpusSplitsAreDisjointAndComplete) {
  const std::string dir = default_dataset_path("sotu");
  if (!fs::is_directory(dir)) {
    GTEST_SKIP() << "sotu corpus not in the cache (" << dir << "); run scripts/fetch_sotu.sh";
  }
  const std::vector<Document> train = load_dataset("sotu", "");
  const std::vector<Document> validation = load_dataset("sotu_validation", "");
  EXPECT_EQ(train.size() + validation.size(), 233u);
  EXPECT_EQ(validation.size(), 23u);
  std::set<std::string> names;
  for (const Document& doc : train) {
    EXPECT_FALSE(is_sotu_validation_file(doc.name)) << doc.name;
    EXPECT_FALSE(doc.text.empty());
    names.insert(doc.name);
  }
  for (const Document& doc : validation) {
    EXPECT_EQ(doc.name[3], '5') << doc.name;
    names.insert(doc.name);
  }
  EXPECT_EQ(names.size(), 233u);
  EXPECT_EQ(train.front().name, "1790_george_washington_n.txt");
  EXPECT_TRUE(std::is_sorted(train.begin(), train.end(),
                             [](const Document& a, const Document& b) { return a.name < b.name; }));
}

}  // namespace test_dataset
}  // namespace titan
