"""JSON schemas as grammars: an object that names its properties takes no others unless
its schema allows them (llama.cpp's, Ollama's and vLLM's default), and an unbounded integer
has at most 16 digits (llama.cpp's), checked token by token against the embedded model's
vocabulary."""

import json

import pytest

from tightkv.engine.grammar import closed_objects

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def admits(model, schema, text: str) -> bool:
    """Whether the schema's grammar takes `text` whole, a token at a time, and is then complete."""
    c = model.constraint(json_schema=schema)
    for token in model.tokenize(text, add_bos=False):
        if not c.allows(token):
            return False
        c.accept(token)
    return c.finished


@pytest.mark.parametrize(
    "schema,text,ok",
    [
        (PERSON, '{"name": "Ann", "age": 30}', True),
        (PERSON, '{"name": "Ann", "age": 30, "city": "Rome"}', False),  # an invented key
        ({**PERSON, "additionalProperties": True}, '{"name": "Ann", "age": 30, "city": "Rome"}', True),
        ({"type": "object"}, '{"city": "Rome"}', True),  # names no properties: any object
        ({"type": "array", "items": PERSON}, '[{"name": "Ann", "age": 3, "x": 1}]', False),
        ({"$defs": {"p": PERSON}, "$ref": "#/$defs/p"}, '{"name": "Ann", "age": 30, "x": 1}', False),
        (PERSON, '{"name": "Ann", "age": -9999999999999999}', True),  # llama.cpp's integers: up to 16 digits
        (PERSON, '{"name": "Ann", "age": 12345678901234567}', False),
        (
            {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer", "maximum": 10**20}}},
            '{"name": "Ann", "age": 12345678901234567}',
            True,
        ),  # the schema's own bounds stand
        (
            {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer", "minimum": 0}}},
            '{"name": "Ann", "age": 12345678901234567}',
            False,
        ),  # and the side it leaves open is bounded, as llama.cpp bounds it
        (
            {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer", "minimum": 0}}},
            '{"name": "Ann", "age": -1}',
            False,
        ),
    ],
)
def test_objects_take_only_their_properties_unless_allowed(embedded, schema, text, ok):
    assert admits(embedded, schema, text) is ok


def test_closing_leaves_intersections_and_explicit_choices_alone():
    both = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert closed_objects(both) == both  # each member closed would leave nothing to match
    open_ = {"properties": {"a": {}}, "additionalProperties": {"type": "string"}}
    assert closed_objects(open_) == open_
    nested = closed_objects({"anyOf": [PERSON], "properties": {"p": PERSON}})
    assert nested["anyOf"][0]["additionalProperties"] is False
    assert nested["properties"]["p"]["additionalProperties"] is False and nested["additionalProperties"] is False
    assert "additionalProperties" not in PERSON  # the caller's schema is not changed


# --- whitespace, as llama.cpp's grammars bound it ------------------------------------------------
@pytest.fixture(scope="module")
def qwen_tokenizer():
    """Qwen2.5-Coder-0.5B's tokenizer alone (its GGUF's metadata; no weights loaded)."""
    import sys
    from pathlib import Path

    from tightkv.gguf.reader import read_gguf
    from tightkv.gguf.tokenizer import load_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from qwen_model import qwen_path

    return load_tokenizer(read_gguf(qwen_path()).metadata)


@pytest.mark.parametrize("schema", [True, PERSON], ids=["json_object", "schema"])
def test_qwen_may_open_an_object_with_a_line_break(qwen_tokenizer, schema):
    """Qwen's likeliest first token of a JSON reply is "{\\n" (#54: forcing '{"' instead sent it
    rambling until max_tokens); the grammar admits it, and the indented object it goes on to write."""
    from tightkv.engine.grammar import Constraint, json_schema_grammar

    c = Constraint(json_schema_grammar(schema), qwen_tokenizer)
    (brace_newline,) = qwen_tokenizer.encode("{\n", add_bos=False)
    assert c.allows(brace_newline)
    for token in qwen_tokenizer.encode(json.dumps({"name": "Ann", "age": 30}, indent=2), add_bos=False):
        assert c.allows(token)
        c.accept(token)
    assert c.finished


@pytest.mark.parametrize(
    "text,ok",
    [
        ('{"name":"Ann","age":30}', True),
        ('{ "name" : "Ann" , "age" : 30 }', True),
        ('{\n\t"name": "Ann",\n\n\t"age": 30\n}', True),
        ("{\n" + " " * 20 + '"name": "Ann", "age": 30}', True),  # llama.cpp's bound: 20 spaces or tabs
        ("{\n" + " " * 21 + '"name": "Ann", "age": 30}', False),
        ('{\n\n\n"name": "Ann", "age": 30}', False),  # at most two line breaks
        ('{  "name": "Ann", "age": 30}', False),  # one space, or a line break first
        ('{"name": "Ann", "age": 30}\n', False),  # nothing after the value
    ],
)
def test_whitespace_between_tokens_is_bounded(embedded, text, ok):
    assert admits(embedded, PERSON, text) is ok


def test_a_model_cannot_run_on_in_whitespace(embedded):
    """Taking whitespace whenever the grammar allows it ends within llama.cpp's bound: a line
    break or two, then 20 spaces, then only JSON."""
    c = embedded.constraint(json_schema=True)

    def tokenize(text: str) -> list[int]:
        return embedded.tokenize(text, add_bos=False)

    for token in tokenize("{\n\n"):
        c.accept(token)
    (space,) = tokenize(" ")
    taken = 0
    while c.allows(space) and taken < 100:
        c.accept(space)
        taken += 1
    assert taken == 20 and not any(c.allows(t) for t in tokenize("\n") + tokenize("\t"))


# --- tool calls: arguments closed like response-format schemas --------------------------------
CITY = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def admits_grammar(model, grammar: str, text: str) -> bool:
    c = model.constraint(grammar=grammar)
    for token in model.tokenize(text, add_bos=False):
        if not c.allows(token):
            return False
        c.accept(token)
    return c.accepting


@pytest.mark.parametrize(
    "fmt,template",
    [
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": %s}\n</tool_call>'),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": %s}]'),
        ("llama3", '{"name": "get_weather", "parameters": %s}'),
    ],
)
def test_call_arguments_take_only_the_schemas_keys(embedded, fmt, template):
    """#54: a forced call's arguments once took invented keys ({"city": "Paris", "city2": "Rome"});
    the tool's schema is closed as a response format's is, unless it allows more."""
    from tightkv.engine.tools import call_grammar

    closed = call_grammar(fmt, [CITY], "get_weather")
    assert admits_grammar(embedded, closed, template % '{"city": "Paris"}')
    assert admits_grammar(embedded, closed, template % '{\n  "city": "Paris"\n}')
    assert not admits_grammar(embedded, closed, template % '{"city": "Paris", "city2": "Rome"}')
    assert not admits_grammar(embedded, closed, template % ('{"city": "Paris"' + " " * 30 + "}"))
    params = {**CITY["function"]["parameters"], "additionalProperties": True}
    open_ = call_grammar(fmt, [{"type": "function", "function": {**CITY["function"], "parameters": params}}])
    assert admits_grammar(embedded, open_, template % '{"city": "Paris", "city2": "Rome"}')
