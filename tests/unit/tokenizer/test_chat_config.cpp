// Where a tokenizer folder keeps its chat template, as transformers reads it: chat_template.jinja
// over tokenizer_config.json's "chat_template" (a string, or named templates of which "default"),
// then chat_template.json; special tokens as strings or AddedToken objects; clear errors.
#include "titan/components/tokenizer/chat_config.h"

#include "titan/common/check.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace titan {
namespace test_chat_config {

namespace fs = std::filesystem;

class ChatConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("titan_chat_config_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  template <typename Error>
  std::string error_of() {
    try {
      read_chat_template_files(dir_.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(ChatConfig, ConfigTemplateAndTokens) {
  write("tokenizer_config.json",
        R"({"bos_token": "<s>", "eos_token": {"__type": "AddedToken", "content": "</s>"},
            "unk_token": null, "chat_template": "{{ bos_token }}x"})");
  const ChatTemplateFiles files = read_chat_template_files(dir_.string());
  EXPECT_EQ(files.source, "{{ bos_token }}x");
  EXPECT_EQ(files.origin, (dir_ / "tokenizer_config.json").string());
  EXPECT_EQ(files.special_tokens.dump(), R"({"bos_token":"<s>","eos_token":"</s>"})");
  // The config file itself may be named.
  EXPECT_EQ(read_chat_template_files((dir_ / "tokenizer_config.json").string()).source,
            "{{ bos_token }}x");
}

TEST_F(ChatConfig, JinjaFileWinsThenNamedDefaultThenChatTemplateJson) {
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                                      {"name": "default", "template": "D"}]})");
  EXPECT_EQ(read_chat_template_files(dir_.string()).source, "D");
  write("chat_template.jinja", "J");
  EXPECT_EQ(read_chat_template_files(dir_.string()).source, "J");
  fs::remove(dir_ / "chat_template.jinja");
  write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  write("chat_template.json", R"({"chat_template": "C"})");
  const ChatTemplateFiles files = read_chat_template_files(dir_.string());
  EXPECT_EQ(files.source, "C");
  EXPECT_EQ(files.special_tokens.dump(), R"({"eos_token":"</s>"})");
}

TEST_F(ChatConfig, ErrorsNameTheFile) {
  write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_NE(error_of<ConfigError>().find("no chat template in"), std::string::npos);
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  EXPECT_NE(error_of<ConfigError>().find("names the templates tool_use but none \"default\""),
            std::string::npos);
  write("tokenizer_config.json", R"({"chat_template": 3})");
  EXPECT_NE(error_of<DataError>().find("\"chat_template\" is number"), std::string::npos);
  write("tokenizer_config.json", R"({"bos_token": 1, "chat_template": "x"})");
  EXPECT_NE(error_of<DataError>().find("\"bos_token\" is number"), std::string::npos);
  write("tokenizer_config.json", "{\"chat_template\": ");
  const std::string bad = error_of<DataError>();
  EXPECT_NE(bad.find("tokenizer_config.json: not valid JSON"), std::string::npos) << bad;
  fs::remove_all(dir_);
  EXPECT_NE(error_of<ConfigError>().find("does not exist"), std::string::npos);
}

}  // namespace test_chat_config
}  // namespace titan
