"""JSON schemas as grammars: an object that names its properties takes no others unless
its schema allows them (llama.cpp's, Ollama's and vLLM's default), and an unbounded integer
has at most 16 digits (llama.cpp's), checked token by token against the embedded model's
vocabulary."""

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
            {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer", "minimum": 0}}},
            '{"name": "Ann", "age": 12345678901234567}',
            True,
        ),  # the schema's own bounds stand
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
