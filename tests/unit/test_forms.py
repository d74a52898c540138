"""The inbox's edit form: fields from a JSON Schema, and the payload back from a post."""

from __future__ import annotations

from shardq.bin.web.forms import fields_of, payload_from

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
