// Fuzzes chat templates: a template's source, as a tokenizer folder would carry it, either renders
// a fixed conversation (multi-turn, a system prompt, a tool call, with and without the generation
// prompt) or throws ConfigError (bad syntax, a feature the engine lacks) / DataError (the template
// refuses the conversation). A crash, a hang, runaway recursion or memory is a finding.
#include "fuzz_util.h"

#include "titan/components/tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  static const nlohmann::ordered_json kMessages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Weather in Paris? {{ x }}"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
      {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "22C"},
    {"role": "assistant", "content": "22 degrees."},
    {"role": "user", "content": "Thanks \u00e9\ud83d\ude80"}
  ])");
  const std::string source(reinterpret_cast<const char*>(data), size);
  fuzz::expect_success_or_rejection([&] {
    const ChatTemplate chat_template(source, "fuzz template");
    ChatTemplateOptions options;
    options.special_tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    options.now = 1700000000;
    apply_chat_template(chat_template, kMessages, options);
    options.add_generation_prompt = true;
    apply_chat_template(chat_template, kMessages, options);
  });
  return 0;
}
