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


# Small templates that probe one language feature each, rendered by transformers' own compiled
# Jinja environment (the one apply_chat_template uses) with the given variables.
SNIPPETS = [
    ("{{ x }}|{{ x.y }}|{{ x['y'] }}|{{ x.y is defined }}", {"x": {"z": 1}}),
    ("{{ 1 }} {{ 1.5 }} {{ 1e20 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 2 ** 0.5 }} {{ 1e16 }} {{ 123456789.0 }}", {}),
    ("{{ -7 // 2 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ true + 1 }}", {}),
    ("{{ none }} {{ true }} {{ [none, true, 'a', 1.0] }} {{ {'k': \"it's\", 'j': 'say \"hi\"'} }} {{ (1,) }} {{ () }}", {}),
    ("{{ 'a\\tb\\n' ~ \"c\\\\d\" ~ '\\u00e9\\x41' }}", {}),
    ("{{ s[0] }}{{ s[-1] }}{{ s[1:3] }}{{ s[::2] }}{{ s[::-1] }}{{ s[5:1:-1] }}{{ s|length }}", {"s": "héllo→wörld"}),
    ("{{ l[1:] }}{{ l[:-1] }}{{ l[-2:] }}{{ l[10:] }}{{ l[::-2] }}", {"l": [1, 2, 3, 4, 5]}),
    ("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}", {"l": ["a", "b", "c"]}),
    ("{% for x in l if x > 1 %}{{ x }}{{ loop.cycle('a', 'b') }}{% else %}none{% endfor %}", {"l": [1, 2, 3]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": [2]}}),
    ("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {}),
    ("{% for c in 'ab→' %}[{{ c }}]{% endfor %}", {}),
    ("{% set ns = namespace(n=0, l=[]) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", {}),
    ("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}{% for i in [1] %}{% set x = 3 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% macro m(a, b=2, c='c') -%}\n  {{ a }}{{ b }}{{ c }}\n{%- endmacro %}\n{{ m(1) }}|{{ m(1, c=3) }}|{{ m(a=0, b=none) }}", {}),
    ("{% set t %}\n  inner {{ 1 }}\n{% endset %}[{{ t }}]", {}),
    ("a\n  {% if true %}\n    b\n  {% endif %}\n  c\n{# comment #}\nd  {%- if true %} e {% endif -%}  \n f", {}),
    ("  {{- 'x' }}  \n  {%+ if true %}y{% endif +%}\nz{%- raw_not_a_tag -%}", None),
    ("{{ 'x' if 0 else 'y' }}|{{ 'x' if [] }}|{{ a or 'b' }}|{{ 0 and 1 }}|{{ not none }}|{{ 1 < 2 <= 2 > 1 }}|{{ 'a' < 'b' }}", {}),
    ("{{ 'ab' in 'cabd' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'x' not in 'abc' }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ 1 == 1.0 }} {{ true == 1 }}", {}),
    ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' x') }}|{{ s.split() }}|{{ s.split(' ') }}|{{ s.split(None, 1) }}|{{ s.rsplit(None, 1) }}", {"s": "  x a  b x \u3000"}),
    ("{{ s.startswith('ab') }}{{ s.endswith(('z', 'c')) }}{{ s.replace('b', 'B', 1) }}{{ s.find('c') }}{{ s.count('b') }}{{ s.upper() }}{{ s.title() }}{{ '-'.join(['a', 'b']) }}", {"s": "abcb"}),
    ("{{ '{} {}'.format('a', 1) }}|{{ '{0}{0}'.format('x') }}|{{ '{n}!'.format(n=2) }}", {}),
    ("{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(separators=(',', ':')) }}|{{ x | tojson(sort_keys=true) }}|{{ x | tojson(ensure_ascii=true) }}", {"x": {"b": [1, 2.5, None, True], "a": "é\"\\\n\t\u0001😀", "c": {}, "d": []}}),
    ("{{ x | tojson(indent='\\t') }}", {"x": {"a": [1, {"b": 2}]}}),
    ("{{ x | tojson(separators=('', '')) }}|{{ x | tojson(indent=0) }}|{{ x | tojson(indent=1, separators=(';', '=')) }}", {"x": {"a": [1, {"b": 2}]}}),
    ("{{ '  a  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ [3, 1] | length }}|{{ 'abc' | count }}|{{ 'aB' | upper }}{{ 'aB' | lower }}{{ 'ab cd' | title }}{{ 'aB' | capitalize }}", {}),
    ("{{ [1, 2] | first }}{{ [1, 2] | last }}{{ [] | first }}{{ 'ab' | first }}|{{ [1, 2] | join }}|{{ [1, 2] | join(', ') }}|{{ [{'a': 1}, {'a': 2}] | join(',', attribute='a') }}", {}),
    ("{{ u | default('d') }}{{ none | default('d') }}{{ '' | default('d') }}{{ '' | default('d', true) }}{{ 0 | d('z', true) }}", {}),
    ("{{ 'aaa' | replace('a', 'b') }}{{ 'aaa' | replace('a', 'b', 2) }}|{{ d | items | list }}|{{ 'ab' | list }}|{{ d | list }}|{{ 1 | string }}{{ none | string }}|{{ '3' | int + 1 }}{{ 'x' | int }}{{ 2.7 | int }}{{ '2.5' | float }}|{{ -3 | abs }}", {"d": {"k": 1, "j": 2}}),
    ("{{ l | selectattr('r', 'equalto', 'u') | list }}|{{ l | rejectattr('r', 'equalto', 'u') | map(attribute='r') | list }}|{{ l | selectattr('x') | list }}|{{ l | map(attribute='x', default='-') | join }}", {"l": [{"r": "u", "x": 1}, {"r": "a"}, {"r": "u", "x": 0}]}),
    ("{{ [1, 2, 3, 4] | select('odd') | list }}{{ [1, 2, 3] | reject('equalto', 2) | list }}{{ ['a', 'B'] | map('upper') | list }}{{ [0, 1, ''] | select | list }}", {}),
    ("{{ [3, 1, 2] | sort }}{{ ['b', 'A', 'c'] | sort }}{{ [3, 1, 2] | sort(reverse=true) }}{{ [{'n': 2}, {'n': 1}] | sort(attribute='n') }}{{ ['a', 'A', 'b'] | unique | list }}{{ [1, 2] | reverse | list }}{{ 'abc' | reverse }}{{ [1, 2.5] | sum }}", {}),
    ("{{ d | dictsort }}{{ d | dictsort(by='value') }}{{ d | dictsort(reverse=true) }}", {"d": {"b": 1, "a": 3, "C": 2}}),
    ("{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(width='> ', blank=true) }}", {}),
    ("{% filter upper %}a{{ 'b' }}{% endfilter %}{% filter trim %}  x  {% endfilter %}", {}),
    ("{{ none is none }}{{ 1 is number }}{{ true is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 's' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 's' is sequence }}{{ u is undefined }}{{ u is iterable }}", {}),
    ("{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 1 is true }}{{ true is true }}{{ false is false }}{{ 'a' is lower }}{{ 'A' is upper }}{{ 2 is gt 1 }}{{ 2 is lt(1) }}{{ 1 is in [1] }}{{ raise_exception is callable }}", {}),
    ("{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}|{{ range(2, 8, 3) | list }}|{{ range(3, 0, -1) | list }}", {}),
    ("{% set d = dict(a=1, b='x') %}{{ d }}{{ dict(d, c=2) }}", {}),
    ("{{ raise_exception('custom failure ' ~ 42) }}", {}),
    ("{{ u.attr }}", {}),
    ("{{ x.content + 'y' }}", {"x": {}}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ [1] + 'a' }}", {}),
    ("{{ none < 1 }}", {}),
    ("{{ 'x' in none }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ [1, 2] | select | length }}", {}),
    ("{% for a in none %}x{% endfor %}", {}),
    ("{{ ('a' | safe) + '<&>' }}{{ '<' + ('b' | safe) }}{{ ('c' | safe) ~ '<' }}", {}),
    ("{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    ("{{ strftime_now('%Y-%m-%d %H:%M:%S %a %b %d %j') }}", {}),
    ("{{ '%s' }}{{ 'x' ~ 1.0 ~ 2 ~ none ~ true }}", {}),
    ("{{ l[5] }}|{{ l[-1] }}|{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 0) }}|{{ d.keys() | list }}{{ d.values() | list }}", {"l": [1, 2], "d": {"a": 1}}),
    ("{%- set x = [1, 2] -%}\n{%- for i in x -%}\n  {{ i }}\n{%- endfor -%}\n", {}),
    ("{% if a %}A{% elif b %}B{% elif c %}C{% else %}D{% endif %}", {"c": 1}),
    ("x {#- strip left #} y {# keep #} z {#- both -#} w", {}),
    ("{{ \"multi\" 'part' }} {{ 1_000 }} {{ 0.5e1 }}", {}),
    # Whitespace control, where byte-for-byte agreement is easiest to lose.
    ("line1\n    {% if true %}\n\tinner\n    {% endif %}\nline2\n", {}),
    ("a {% if true %} b {% endif %} c\n  {% for i in [1, 2] %}\n  {{ i }}\n  {% endfor %}\nend", {}),
    ("\t  {# comment #}\t\nx\n  {#- c2 #}  y\n {# c3 -#}\n z", {}),
    ("{% if true -%}\n\n   x   \n\n{%- endif %}|{{- '  y  ' -}}|  {{ 'z' }}  ", {}),
    ("{%- for m in ['a', 'b'] %}\n    {{- m }}\n{%- endfor %}\n\n{{ 'end' }}\n\n", {}),
    ("x\r\n  {% if true %}\r\ny\r\n  {% endif %}\r\nz\r\n", {}),
    ("  {{ 'a' }}\n  {%- if true %}b{% endif -%}\n  c", {}),
    ("{% macro m() %}\n  body\n{% endmacro %}\n[{{ m() }}]\n[{{- m() -}}]", {}),
    ("{% set x = 1 %}\n{% set y = 2 %}\n{{ x }}{{ y }}\n\n", {}),
    ("\u00a0 {% if true %}nbsp{% endif %}\n text {%- if true %} \u3000{% endif -%} \u3000 after", {}),
    ("{{ 'a' }}{# only comment #}\n{{ 'b' }}\n{# c #}{{ 'c' }}", {}),
    ("{% if true %}{% if true %}\n  nested\n{% endif %}{% endif %}\n", {}),
    ("plain text only\n", {}),
    ("{{ 2.675|round(2) }} {{ 2.5|round }} {{ 3|round }} {{ 2.1|round(0, 'ceil') }} {{ -2.5|round(method='floor') }} {{ 0.125|round(2) }} {{ 1e300|round(2) }}", {}),
    ("{{ [3, 1, 2]|min }} {{ ['b', 'A']|max }} {{ []|min }} {{ [{'a': 2}, {'a': 1}]|min(attribute='a') }}", {}),
    ("{{ '%s-%d-%5.2f|%-4s|%r|%%|%x|%05d|%+.1e|%g'|format('a', 3, 2.345, 'b', 'q', 255, 42, 12345.678, 0.0001) }}", {}),
    ("{{ '%s and %s' % (1, 'x') }}|{{ '%s' % none }}|{{ '%(a)s' % {'a': 1} }}|{{ '%s' % [1, 2] }}|{{ '<&>'|e }}|{{ '<'|escape + '<' }}|{{ '%(n)03d'|format(n=7) }}", {}),
    ("{{ '%d' % 'x' }}", {}),
    ("{{ '%s %s' % (1,) }}", {}),
    ("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}|{{ m() }}", {}),
    ("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, b=2) }}", {}),
    ("a\n  {% raw %}{{ not }} {% if %}\n  {% endraw %}\nb {%- raw -%}  x  {%- endraw -%}  c {%+ raw %}y{% endraw +%}\nz", {}),
    ("{% set x = 1 %}{% with x = 2, y = x %}{{ x }}{{ y }}{% set z = 3 %}{% endwith %}{{ x }}{{ z }}", {}),
    ("{{ {'a': {'b': 1}} }}{{ {'x': [1, {'y': 2}]}['x'][1]['y'] }}", {}),
    ("{% set d = {0: 'zero', 512: 'k', 'k': 1, none: 2, true: 3} %}{{ d }}|{{ d[512] }}{{ d[1] }}{{ d[1.0] }}|{{ d | tojson }}|{{ d.get(0) }}|{{ 512 in d }}|{{ d[[1]] }}|{{ d[7] is defined }}|{% for k in d %}{{ k }},{% endfor %}", {}),
    ("{{ \"they're 1st (a-b) x\" | title }}|{{ \"they're 1st\".title() }}|{{ '2.5' | int }}{{ ' 7 ' | int }}{{ [1, 2] | sum(start=10) }}|{{ '你好 abc' | upper }}|{{ 'ÀB' | length }}", {}),
    ("{{ u | int }}", {}),
    ("{% if true %}{{ 1 | nofilter }}{% endif %}", {}),
    ("{% if false %}{{ 1 | nofilter }}{{ 1 is notest }}{% endif %}{{ 2 | nofilter if false else 3 }}", {}),
    ("{{ 1 | nofilter }}", {}),
    ("{% if true %}{% for i in [] %}{{ 1 | nofilter }}{% endfor %}{% endif %}", {}),
    ("{{ [1] | map('nofilter') | list }}", {}),
    ("{{ [1] | select('notest') | list }}", {}),
    ("{% set l = [] %}{{ l.append(1) }}", {}),
    ("{{ u | indent }}", {}),
    ("{% set d = {2: 'b', 1: 'a'} %}{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}{{ d.keys() | list }}{{ d.items() | list }}", {}),
]


def render_snippet(source, variables):
    try:
        template = chat_template_utils._compile_jinja_template(source)
        return {"expected": template.render(**variables)}
    except jinja2.exceptions.TemplateSyntaxError as error:
        return {"syntax_error": str(error)}
    except jinja2.exceptions.TemplateError as error:
        return {"error": str(error)}
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as error:
        return {"error_type": type(error).__name__, "python_error": str(error)}


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
        "snippets": [
            {"source": source, "variables": variables or {}, **render_snippet(source, variables or {})}
            for source, variables in SNIPPETS
        ],
    }
    json.dump(fixture, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
