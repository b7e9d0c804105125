"""Chat templates of each supported family, rendered by `render_chat` exactly as
transformers' `apply_chat_template` renders them (same template string, same
messages), and checked against hand-written prompts.

The templates are the models' own `chat_template`s (tokenizer_config.json, and
the GGUFs converted from them): Llama 3 8B Instruct, Llama 3.2 Instruct (also
3.1), Qwen2.5 Instruct, Qwen3, Phi-3.5 mini instruct, Mistral 7B Instruct v0.1
and v0.2, Gemma 3 (it), SmolLM2 Instruct; gpt-oss 120b and Gemma 4 31B it
(tests/reference/templates), also with tools, tool calls and their responses,
reasoning, and gpt-oss's `reasoning_effort`, `builtin_tools` and `model_identity`.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from tightkv.engine.chat import render_chat
from tightkv.errors import TightKVError

LLAMA3 = r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"""

LLAMA32 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

PHI35 = r"""{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %}"""

MISTRAL_V01 = r"""{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"""

MISTRAL_V02 = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

GEMMA3 = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

SMOLLM2 = r"""{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}"""

# name -> (template, bos_token, eos_token)
TEMPLATES = Path(__file__).resolve().parent / "reference" / "templates"
GPT_OSS = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
GEMMA4 = (TEMPLATES / "google-gemma-4-31B-it.jinja").read_text(encoding="utf-8")

FAMILIES = {
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2": (LLAMA32, "<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": (QWEN25, "", "<|im_end|>"),
    "qwen3": (QWEN3, "", "<|im_end|>"),
    "phi3.5": (PHI35, "<s>", "<|endoftext|>"),
    "mistral-v0.1": (MISTRAL_V01, "<s>", "</s>"),
    "mistral-v0.2": (MISTRAL_V02, "<s>", "</s>"),
    "gemma3": (GEMMA3, "<bos>", "<eos>"),
    "smollm2": (SMOLLM2, "<|im_start|>", "<|im_end|>"),
    "gpt-oss": (GPT_OSS, "<|startoftext|>", "<|return|>"),
    "gemma4": (GEMMA4, "<bos>", "<eos>"),
}

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "What is 2+2?"},
]
NO_SYSTEM = CHAT[1:]

LLAMA3_TURNS = (
    "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
CHATML_TURNS = (
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
)
QWEN_DEFAULT = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
SMOL_DEFAULT = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"

# (family, messages, extra template variables) -> the prompt
EXPECTED = [
    (
        "llama3",
        CHAT,
        {},
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>" + LLAMA3_TURNS,
    ),
    (
        "llama3.2",
        CHAT,
        {"date_string": "26 Jul 2024"},
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\nYou are terse.<|eot_id|>" + LLAMA3_TURNS,
    ),
    (
        "llama3.2",
        NO_SYSTEM,
        {"date_string": "26 Jul 2024"},
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\n<|eot_id|>" + LLAMA3_TURNS,
    ),
    ("qwen2.5", CHAT, {}, "<|im_start|>system\nYou are terse.<|im_end|>\n" + CHATML_TURNS),
    ("qwen2.5", NO_SYSTEM, {}, QWEN_DEFAULT + CHATML_TURNS),
    ("qwen3", CHAT, {}, "<|im_start|>system\nYou are terse.<|im_end|>\n" + CHATML_TURNS),
    ("qwen3", NO_SYSTEM, {}, CHATML_TURNS),
    ("qwen3", NO_SYSTEM, {"enable_thinking": False}, CHATML_TURNS + "<think>\n\n</think>\n\n"),
    ("qwen3", NO_SYSTEM, {"enable_thinking": True}, CHATML_TURNS),
    # an earlier answer's reasoning is dropped from the history
    (
        "qwen3",
        [NO_SYSTEM[0], {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello."}, NO_SYSTEM[2]],
        {},
        CHATML_TURNS,
    ),
    (
        "phi3.5",
        CHAT,
        {},
        "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi!<|end|>\n<|assistant|>\nHello.<|end|>\n"
        "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n",
    ),
    ("mistral-v0.1", NO_SYSTEM, {}, "<s>[INST] Hi! [/INST]Hello.</s>[INST] What is 2+2? [/INST]"),
    ("mistral-v0.2", CHAT, {}, "<s> [INST] You are terse.\n\nHi! [/INST] Hello.</s> [INST] What is 2+2? [/INST]"),
    ("mistral-v0.2", NO_SYSTEM, {}, "<s> [INST] Hi! [/INST] Hello.</s> [INST] What is 2+2? [/INST]"),
    (
        "gemma3",
        CHAT,
        {},
        "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n<start_of_turn>model\n"
        "Hello.<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    ),
    ("smollm2", CHAT, {}, "<|im_start|>system\nYou are terse.<|im_end|>\n" + CHATML_TURNS),
    ("smollm2", NO_SYSTEM, {}, SMOL_DEFAULT + CHATML_TURNS),
    (
        "gemma4",
        CHAT,
        {},
        "<bos><|turn>system\nYou are terse.<turn|>\n<|turn>user\nHi!<turn|>\n<|turn>model\nHello.<turn|>\n"
        "<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
    ),
    (
        "gemma4",
        NO_SYSTEM[:1],
        {"enable_thinking": True},
        "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi!<turn|>\n<|turn>model\n",
    ),
]


def render(family: str, messages: list[dict], **extra) -> str:
    template, bos, eos = FAMILIES[family]
    return render_chat(template, messages, bos_token=bos, eos_token=eos, add_generation_prompt=True, **extra)


@pytest.mark.parametrize(
    "family, messages, extra, expected", EXPECTED, ids=[f"{f}-{i}" for i, (f, *_) in enumerate(EXPECTED)]
)
def test_expected_prompt(family, messages, extra, expected):
    assert render(family, messages, **extra) == expected


def test_llama32_dates_today():
    """Without a date_string the template asks strftime_now for today's date."""
    before = datetime.now().strftime("%d %b %Y")
    text = render("llama3.2", CHAT)
    assert f"Today Date: {before}\n\n" in text or f"Today Date: {datetime.now().strftime('%d %b %Y')}\n\n" in text


def test_without_generation_prompt():
    template, bos, eos = FAMILIES["phi3.5"]
    text = render_chat(template, CHAT[:3], bos_token=bos, eos_token=eos, add_generation_prompt=False)
    assert (
        text == "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi!<|end|>\n<|assistant|>\nHello.<|end|>\n<|endoftext|>"
    )


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, in °C",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_tools_render_as_json():
    """tojson as transformers defines it: no HTML escaping, non-ASCII kept, indent honoured."""
    text = render("qwen2.5", NO_SYSTEM[:1], tools=[WEATHER])
    assert (
        '\n{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, in °C"'
        in text
    )
    text = render("llama3.2", NO_SYSTEM[:1], tools=[WEATHER], date_string="26 Jul 2024")
    assert '{\n    "type": "function",\n    "function": {\n        "name": "get_weather",' in text
    assert "Given the following functions" in text and text.count("Hi!") == 1


@pytest.mark.parametrize(
    "family, messages, message",
    [
        ("mistral-v0.1", CHAT, "Conversation roles must alternate user/assistant/user/assistant/..."),
        ("gemma3", [CHAT[1], CHAT[1]], "Conversation roles must alternate user/assistant/user/assistant/..."),
        (
            "mistral-v0.2",
            [CHAT[0], CHAT[1], CHAT[1]],
            "After the optional system message, conversation roles must alternate",
        ),
        (
            "mistral-v0.2",
            [CHAT[0], CHAT[1], {"role": "tool", "content": "x"}],
            "Only user and assistant roles are supported",
        ),
    ],
)
def test_raise_exception_is_one_line_error(family, messages, message):
    with pytest.raises(TightKVError) as err:
        render(family, messages)
    text = str(err.value)
    assert "\n" not in text and text.startswith("chat template: ") and message in text


def test_generation_tag():
    """`{% generation %}` (transformers' assistant-mask marker) renders its body."""
    template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}[{{ m['content'] }}]"
        "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    assert render_chat(template, CHAT[1:3]) == "Hi![Hello.]"


def test_loop_controls():
    template = "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{{ m['role'][0] }}{% endfor %}"
    assert render_chat(template, CHAT) == "sau"


# -- the same templates through transformers ---------------------------------------


def hf_render(family: str, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    template, bos, eos = FAMILIES[family]
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos or None, eos_token=eos, unk_token="<unk>"
    )
    return tok.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )


@pytest.mark.parametrize(
    "family, messages, extra, expected", EXPECTED, ids=[f"{f}-{i}" for i, (f, *_) in enumerate(EXPECTED)]
)
def test_same_as_transformers(family, messages, extra, expected):
    assert hf_render(family, messages, **extra) == expected


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "llama3.2"])
def test_tools_same_as_transformers(family):
    extra = {"tools": [WEATHER], "date_string": "26 Jul 2024"}
    assert render(family, NO_SYSTEM, **extra) == hf_render(family, NO_SYSTEM, **extra)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_no_generation_prompt_same_as_transformers(family):
    template, bos, eos = FAMILIES[family]
    messages = NO_SYSTEM[:2]
    extra = {"date_string": "26 Jul 2024"}
    ours = render_chat(template, messages, bos_token=bos, eos_token=eos, add_generation_prompt=False, **extra)
    assert ours == hf_render(family, messages, add_generation_prompt=False, **extra)


def test_continuing_the_assistant_message():
    """llama.cpp's prefill: the conversation before the last (assistant) message with the
    generation prompt, then its content as written; a conversation of that message alone is
    cut after its content (vLLM's continue_final_message)."""
    from tightkv.engine.chat import continues, render_continuation

    template, bos, eos = FAMILIES["qwen3"]
    msgs = NO_SYSTEM + [{"role": "assistant", "content": "<think>\nFour"}]
    text = render_continuation(template, msgs, bos, eos)
    assert text == render_chat(template, msgs[:-1], bos, eos, add_generation_prompt=True) + "<think>\nFour"
    assert text == CHATML_TURNS + "<think>\nFour"
    gemma = FAMILIES["gemma3"]
    assert (
        render_continuation(gemma[0], [NO_SYSTEM[0], {"role": "assistant", "content": "Hel "}], *gemma[1:])
        == "<bos><start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\nHel "
    )  # not trimmed
    assert (
        render_continuation(template, [{"role": "assistant", "content": "Hello th"}], bos, eos)
        == "<|im_start|>assistant\nHello th"
    )
    assert continues(msgs) and not continues(NO_SYSTEM) and not continues(msgs, continue_final=False)
    assert not continues([{"role": "assistant", "content": "", "tool_calls": [{}]}])
    with pytest.raises(TightKVError):
        continues(NO_SYSTEM, continue_final=True)


# -- gpt-oss and Gemma 4: tools, tool calls, reasoning ------------------------------

CALL = {
    "role": "assistant",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": '{"temp": 21, "sky": "<clear> & ü"}'}
RICH_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, in °C",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": 'City <name> & "quoted"'},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city"],
        },
    },
}
CONVERSATIONS = {
    "chat": CHAT,
    "call": [{"role": "user", "content": "Weather in Paris?"}, {**CALL, "content": ""}, RESULT],
    # OpenAI's API lets a message with tool calls leave its content out
    "call-no-content": [CHAT[0], {"role": "user", "content": "Weather in Paris?"}, CALL, RESULT],
    "call-string-arguments": [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        RESULT,
        {"role": "assistant", "content": "It is 21°C."},
        {"role": "user", "content": "Thanks"},
    ],
    "reasoning": [
        {"role": "user", "content": "Weather?"},
        {**CALL, "content": "", "thinking": "Call the tool.", "reasoning_content": "Call the tool."},
        RESULT,
    ],
}
OPTIONS = {
    "gpt-oss": [
        {},
        {"reasoning_effort": "high"},
        {"builtin_tools": ["browser", "python"], "model_identity": "You are a test."},
    ],
    "gemma4": [{}, {"enable_thinking": True}, {"enable_thinking": False}],
}


@pytest.mark.parametrize("family", ["gpt-oss", "gemma4"])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_tool_conversations_same_as_transformers(family, conversation, add_generation_prompt):
    template, bos, eos = FAMILIES[family]
    messages = CONVERSATIONS[conversation]
    for options in OPTIONS[family]:
        for tools in ([RICH_WEATHER], None):
            extra = {**options, "tools": tools}
            ours = render_chat(template, messages, bos, eos, add_generation_prompt=add_generation_prompt, **extra)
            theirs = hf_render(family, messages, add_generation_prompt=add_generation_prompt, **extra)
            assert ours == theirs, (options, tools)


def test_gpt_oss_prompt():
    """The harmony prompt: system message with today's date and the reasoning effort."""
    text = render("gpt-oss", CHAT, reasoning_effort="low")
    today = datetime.now().strftime("%Y-%m-%d")
    assert text == (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        f"Knowledge cutoff: 2024-06\nCurrent date: {today}\n\nReasoning: low\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nYou are terse.\n\n<|end|>"
        "<|start|>user<|message|>Hi!<|end|><|start|>assistant<|channel|>final<|message|>Hello.<|end|>"
        "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant"
    )


def test_gpt_oss_refuses_channel_tags_in_content():
    messages = [NO_SYSTEM[0], {"role": "assistant", "content": "<|channel|>final<|message|>Hi"}, NO_SYSTEM[2]]
    with pytest.raises(TightKVError, match="^chat template: You have passed a message containing <.channel.> tags"):
        render("gpt-oss", messages)


def test_message_needs_content_or_tool_calls():
    with pytest.raises(TightKVError, match="needs a 'role' and a 'content'"):
        render("gemma4", [{"role": "user"}])
