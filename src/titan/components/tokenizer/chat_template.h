// Chat templates: a C++ renderer for the Jinja2 subset that Hugging Face chat templates use, so
// that a conversation becomes exactly the text transformers' tokenizer.apply_chat_template(...,
// tokenize=False) makes of it (byte for byte), with no Python at training time.
//
// The engine follows Jinja2 3.1 as transformers configures it: trim_blocks and lstrip_blocks on,
// the loopcontrols extension (break/continue), its own tojson (ensure_ascii=False, indent,
// separators, sort_keys), raise_exception, strftime_now, namespace() and the {% generation %} tag.
// Values print as Python prints them (None, True, 1.0, ['a', 1]) and strings index, slice and count
// by code point. What the engine does not implement is an error naming the feature and the template
// line (ConfigError), never a silently different rendering. A template that rejects a conversation
// (raise_exception, an undefined value used in arithmetic, str + dict) throws DataError with the
// message Jinja would give.
//
// Not implemented (ConfigError when a template uses them): {% call %} and macros reading
// `caller`, include/import/extends/block, recursive loops, loop.changed, the filters groupby,
// batch, slice, truncate, wordwrap, wordcount, center, striptags, urlencode, urlize, xmlattr,
// pprint, filesizeformat, attr and random, the less common str methods, `*` widths in %
// formatting, case mapping of non-ASCII letters, and integers beyond 64 bits. apply_chat_template
// has no continue_final_message or assistant-token mask.
#pragma once

#include <nlohmann/json.hpp>

#include <ctime>
#include <memory>
#include <optional>
#include <string>

namespace titan {

namespace jinja {
struct Program;
}  // namespace jinja

// A parsed template; rendering does not modify it, so one object may render from many threads.
class ChatTemplate {
 public:
  // Parses `source`; throws ConfigError on a syntax error or an unsupported tag, filter or test.
  // `name` appears in every error message (e.g. the tokenizer path).
  explicit ChatTemplate(std::string source, std::string name = "chat template");
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with `variables` (a JSON object) as the template's context. Objects keep their key
  // order, as Python dicts do, which is why the type is ordered_json: tojson and `for k, v in
  // d.items()` print in that order. `now` is the instant strftime_now() formats (in local time, as
  // Python's datetime.now() does); unset means the current time.
  std::string render(const nlohmann::ordered_json& variables,
                     std::optional<std::time_t> now = std::nullopt) const;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::unique_ptr<jinja::Program> program_;
};

// What apply_chat_template passes besides the messages. transformers passes the tokenizer's special
// tokens (bos_token, eos_token, unk_token, pad_token, ... those that are set), `tools` and
// `documents` (None unless given), add_generation_prompt, and every extra keyword argument
// (enable_thinking, reasoning_effort, ...), which override special tokens of the same name.
struct ChatTemplateOptions {
  // Special tokens by name ({"bos_token": "<|begin_of_text|>", ...}); only those given are defined.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  bool add_generation_prompt = false;
  // A list of JSON tool schemas, or null for none.
  nlohmann::ordered_json tools = nullptr;
  // A list of documents, or null for none.
  nlohmann::ordered_json documents = nullptr;
  // Extra template variables (a JSON object).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // The instant strftime_now() formats; unset means now.
  std::optional<std::time_t> now;
};

// Renders one conversation (a list of message objects) as transformers' apply_chat_template(
// messages, tokenize=False, ...) does: keys whose value is null are dropped from each message, and
// a message's reasoning (reasoning_content, thinking or reasoning) is copied to both
// `reasoning_content` and `thinking`, the names templates read. Throws ConfigError on an empty
// conversation or a message that is not an object.
std::string apply_chat_template(const ChatTemplate& chat_template,
                                const nlohmann::ordered_json& messages,
                                const ChatTemplateOptions& options = {});

}  // namespace titan
