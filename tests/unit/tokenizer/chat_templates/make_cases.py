# Renders every conversation in CONVERSATIONS with every chat template in this folder through Hugging
# Face transformers' own apply_chat_template (tokenize=False), and prints the fixture that
# tests/unit/tokenizer/test_chat_template.cpp compares our C++ renderer against byte for byte.
#
#   python tests/unit/tokenizer/chat_templates/make_cases.py > tests/unit/tokenizer/chat_templates/cases.json
#
# Needs transformers (5.x) and Jinja2 (3.1.6); no model hub access: the tokenizer is built in memory
# and only carries the special tokens the template reads. strftime_now is pinned to kNow below so
# the renderings do not depend on the day they are made; the C++ test formats the same instant in
# UTC. A template's raise_exception (or any other error) is recorded instead of a rendering.
import datetime
import json
import pathlib
import sys

import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils

HERE = pathlib.Path(__file__).parent

# What datetime.now() returns while rendering (naive, so the same in every time zone).
kNow = datetime.datetime(2024, 7, 26, 13, 5, 9)


class _FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return kNow


chat_template_utils.datetime = _FixedDatetime

# Special tokens each template family's tokenizer_config.json sets.
SPECIAL_TOKENS = {
    "meta-llama-Llama-3.1-8B-Instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "meta-llama-Llama-3.2-3B-Instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "Qwen-Qwen3-0.6B": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "Qwen-Qwen2.5-7B-Instruct": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "deepseek-ai-DeepSeek-V3.1": {
        "bos_token": "<｜begin▁of▁sentence｜>",
        "eos_token": "<｜end▁of▁sentence｜>",
    },
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": {
        "bos_token": "<｜begin▁of▁sentence｜>",
        "eos_token": "<｜end▁of▁sentence｜>",
    },
    "openai-gpt-oss-120b": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"},
    "google-gemma-2-2b-it": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "mistralai-Mistral-Nemo-Instruct-2407": {"bos_token": "<s>", "eos_token": "</s>"},
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "description": "Forecast days"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web for ünïcödé and \"quotes\"",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "number"}, "safe": {"type": "boolean"}},
            "required": ["query", "limit"],
        },
    },
}


def tool_call(name, arguments, call_id="call12345"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


U = lambda text: {"role": "user", "content": text}
A = lambda text: {"role": "assistant", "content": text}
S = lambda text: {"role": "system", "content": text}

# Each case: name, messages, and optional tools / extra keyword arguments. Both add_generation_prompt
# values are rendered for every case.
CONVERSATIONS = [
    ("single_user", [U("Hello!")], {}),
    ("system_user", [S("You are a helpful assistant."), U("What is 2+2?")], {}),
    ("multi_turn", [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."), A("Why did the chicken cross the road?"), U("Why?")], {}),
    ("system_multi_turn", [S("Be terse."), U("a"), A("b"), U("c")], {}),
    ("ends_with_assistant", [U("Ping"), A("Pong")], {}),
    ("empty_content", [U(""), A(""), U("still there?")], {}),
    ("unicode", [U("Grüße aus Köln 🚀 — 你好，世界 \u00e9\u0301"), A("Привет! ¿Qué tal? 😀")], {}),
    ("whitespace", [S("  padded system  \n"), U("\n  leading and trailing  \n\n"), A("  answer  ")], {}),
    ("special_chars", [U("{{ not a template }} {% if %} <|eot_id|> \\n \"quoted\" 'single'"), A("<b>&amp;</b>")], {}),
    ("long_multi_turn", [U(f"question {i}") if i % 2 == 0 else A(f"answer {i}") for i in range(9)], {}),
    ("think_in_content", [U("Solve x+1=2"), A("<think>\nx = 2 - 1\n</think>\n\nx = 1"), U("Thanks")], {}),
    ("reasoning_content", [U("Why is the sky blue?"), {"role": "assistant", "content": "Rayleigh scattering.", "reasoning_content": "Short wavelengths scatter more."}], {}),
    ("thinking_last_turn", [U("2*3?"), {"role": "assistant", "content": "6", "thinking": "two times three"}], {}),
    ("tools_no_calls", [S("You can call tools."), U("Weather in Paris?")], {"tools": [WEATHER_TOOL, SEARCH_TOOL]}),
    ("tool_call_round_trip", [
        U("What's the weather in Paris?"),
        {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", {"city": "Paris", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temperature\": 21}"},
        A("It is 21 °C in Paris."),
    ], {"tools": [WEATHER_TOOL]}),
    ("tool_call_string_args", [
        S("Use tools when needed."),
        U("Search for cats"),
        {"role": "assistant", "content": None, "tool_calls": [tool_call("search", "{\"query\": \"cats\", \"limit\": 3}", "abcdefghi")]},
        {"role": "tool", "tool_call_id": "abcdefghi", "content": "cats are great"},
    ], {"tools": [SEARCH_TOOL]}),
    ("two_tool_calls", [
        U("Weather in Paris and Rome?"),
        {"role": "assistant", "content": None, "tool_calls": [tool_call("get_weather", {"city": "Paris"}, "call00001"), tool_call("get_weather", {"city": "Rome"}, "call00002")]},
        {"role": "tool", "tool_call_id": "call00001", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call00002", "content": "rainy"},
    ], {"tools": [WEATHER_TOOL]}),
    ("developer_role", [{"role": "developer", "content": "Answer in French."}, U("Hello")], {}),
    ("extra_kwargs", [U("Think hard")], {"reasoning_effort": "high", "enable_thinking": False, "thinking": True, "date_string": "01 Jan 2025"}),
    ("builtin_tools", [U("Browse for news")], {"builtin_tools": ["browser", "python"], "model_identity": "You are a test model."}),
    ("system_only", [S("Only a system prompt.")], {}),
    ("content_blocks", [
        {"role": "system", "content": [{"type": "text", "text": "Block system."}]},
        {"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "text", "text": " two blocks"}]},
    ], {}),
    ("nested_tool_arguments", [
        U("Plan a trip"),
        {"role": "assistant", "content": "Calling.", "tool_calls": [tool_call("get_weather", {"city": "Zürich", "days": 3, "scale": 1.5, "tags": ["a", "b"], "opts": {"x": None, "y": True}})]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "ok"},
    ], {"tools": [WEATHER_TOOL, SEARCH_TOOL]}),
    ("two_system", [S("First."), S("Second."), U("Go")], {}),
]


def make_tokenizer(name):
    special_tokens = SPECIAL_TOKENS.get(name, {"bos_token": "<s>", "eos_token": "</s>"})
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), **special_tokens)
    tokenizer.chat_template = (HERE / f"{name}.jinja").read_text()
    return tokenizer


def render(tokenizer, messages, kwargs, add_generation_prompt):
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )
        return {"expected": text}
    except jinja2.exceptions.TemplateError as error:
        # A template refusing a conversation (raise_exception) is part of what must agree: the C++
        # renderer must throw with the same message.
        return {"error": str(error)}
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as error:
        # A template that cannot render this conversation at all (e.g. str + dict): the C++
        # renderer must throw too, with a message of its own.
        return {"error_type": type(error).__name__, "python_error": str(error)}


def main():
    # Conversations and special tokens are stored once; each case names them.
    conversations = {}
    for name, messages, kwargs in CONVERSATIONS:
        kwargs = dict(kwargs)
        conversation = {"messages": messages}
        if "tools" in kwargs:
            conversation["tools"] = kwargs.pop("tools")
        if kwargs:
            conversation["extra"] = kwargs
        conversations[name] = conversation
    templates = {}
    cases = []
    for path in sorted(HERE.glob("*.jinja")):
        tokenizer = make_tokenizer(path.stem)
        templates[path.stem] = {"special_tokens": tokenizer.special_tokens_map}
        for name, conversation in conversations.items():
            call_kwargs = dict(conversation.get("extra", {}))
            if "tools" in conversation:
                call_kwargs["tools"] = conversation["tools"]
            for add_generation_prompt in (False, True):
                case = {"template": path.stem, "conversation": name, "add_generation_prompt": add_generation_prompt}
                case.update(render(tokenizer, conversation["messages"], call_kwargs, add_generation_prompt))
                cases.append(case)
    fixture = {
        "now": kNow.isoformat(),
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "templates": templates,
        "conversations": conversations,
        "cases": cases,
    }
    json.dump(fixture, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
