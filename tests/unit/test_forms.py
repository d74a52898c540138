"""The inbox's edit form: fields from a JSON Schema, and the payload back from a post."""

from __future__ import annotations

from shardq.bin.web.forms import fields_of, initial_form, payload_from

SCHEMA = {
    "type": "object",
    "required": ["reason", "amount", "currency"],
    "properties": {
        "reason": {"type": "string", "minLength": 1, "maxLength": 80, "title": "Why"},
        "amount": {"type": "number", "minimum": 0},
        "seats": {"type": "integer", "maximum": 9},
        "currency": {"enum": ["EUR", "USD"]},
        "urgent": {"type": "boolean"},
        "lines": {"type": "array", "items": {"type": "string"}},
    },
}


def test_each_kind_of_property_gets_its_input() -> None:
    fields = fields_of(SCHEMA)
    assert fields is not None
    by_name = {f.name: f for f in fields}
    assert [f.name for f in fields] == list(SCHEMA["properties"])  # the schema's order
    assert (by_name["reason"].kind, by_name["reason"].title, by_name["reason"].attrs) == (
        "string", "Why", (("minlength", "1"), ("maxlength", "80")))
    assert by_name["amount"].attrs == (("min", "0"), ("step", "any"))
    assert by_name["seats"].attrs == (("max", "9"), ("step", "1"))
    assert (by_name["currency"].kind, by_name["currency"].options) == ("enum", ("EUR", "USD"))
    assert by_name["urgent"].kind == "boolean" and by_name["lines"].kind == "json"
    assert [f.name for f in fields if f.required] == ["reason", "amount", "currency"]
    assert by_name["amount"].path == "/amount"


def test_a_schema_that_is_not_an_object_of_properties_is_one_json_text() -> None:
    assert fields_of({"type": "array"}) is None
    assert fields_of(None) is None
    assert payload_from(None, {"payload": '[1, "two"]'}) == ([1, "two"], [])
    payload, problems = payload_from(None, {"payload": "[1,"})
    assert payload is None and problems[0]["field_path"] == ""


def test_the_posted_form_becomes_the_payload_with_its_problems_at_their_fields() -> None:
    fields = fields_of(SCHEMA)
    payload, problems = payload_from(fields, {
        "field:reason": "travel", "field:amount": "12.5", "field:seats": "2",
        "field:currency": "EUR", "field:urgent": "true", "field:lines": '["a", "b"]',
    })
    assert problems == []
    assert payload == {"reason": "travel", "amount": 12.5, "seats": 2, "currency": "EUR",
                       "urgent": True, "lines": ["a", "b"]}
    # Absent optional fields stay absent; an unticked box is false; bad values are named.
    payload, problems = payload_from(fields, {
        "field:reason": "", "field:amount": "lots", "field:seats": "2.5",
        "field:lines": "[oops"})
    assert payload == {"urgent": False}
    assert [p["field_path"] for p in problems] == ["/amount", "/seats", "/lines"]
    _, infinite = payload_from(fields, {"field:amount": "1e999"})
    assert infinite[0]["field_path"] == "/amount"


def test_a_json_text_is_read_by_the_api_s_rules() -> None:
    """A key twice in one object (json.loads keeps the last) or NaN is a problem at its
    field, as the same text in an API body is a 400."""
    fields = fields_of(SCHEMA)
    for text, says in (('[{"b": 1, "b": 2}]', "the text repeats the key 'b' in one object"),
                       ("[NaN]", "the text is not valid JSON: NaN is not a JSON value")):
        payload, problems = payload_from(fields, {"field:reason": "r", "field:lines": text})
        assert payload == {"reason": "r", "urgent": False}
        assert problems == [{"message": says, "field_path": "/lines"}]
    whole, problems = payload_from(None, {"payload": '{"a": 1, "a": 2}'})
    assert whole is None
    assert problems == [{"message": "the text repeats the key 'a' in one object",
                         "field_path": ""}]


def test_the_form_starts_from_the_value_and_reads_back_as_it() -> None:
    fields = fields_of(SCHEMA)
    value = {"reason": "travel", "amount": 12.5, "seats": 2, "currency": "EUR",
             "urgent": True, "lines": ["a", {"b": 1}]}
    shown = initial_form(fields, value)
    assert shown == {"field:reason": "travel", "field:amount": "12.5", "field:seats": "2",
                     "field:currency": "EUR", "field:urgent": "true",
                     "field:lines": '[\n  "a",\n  {\n    "b": 1\n  }\n]'}
    # Sent back unchanged, the form is the value: a reviewer changes only what they mean to.
    assert payload_from(fields, shown) == (value, [])
    assert initial_form(fields, {"amount": 120, "seats": 3.0, "urgent": False}) == {
        "field:amount": "120", "field:seats": "3"}


def test_a_value_a_field_cannot_hold_leaves_that_field_empty() -> None:
    fields = fields_of(SCHEMA)
    assert initial_form(fields, {
        "reason": "two\nlines", "amount": "lots", "seats": 2.5, "currency": "GBP",
        "urgent": "yes", "lines": ["kept"]}) == {"field:lines": '[\n  "kept"\n]'}
    assert initial_form(fields, {"amount": True, "seats": float("inf")}) == {}
    assert initial_form(fields, ["not", "an", "object"]) == {}
    assert initial_form(fields, None) == {}
    # Without fields the payload is one JSON text, and the value fills it.
    assert initial_form(None, [1, "two"]) == {"payload": '[\n  1,\n  "two"\n]'}
