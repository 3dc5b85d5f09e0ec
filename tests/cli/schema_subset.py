"""A JSON Schema validator for the subset of keywords the server's constrained decoding supports, written from the
JSON Schema spec: the oracle the e2e tests check structured and tool-call output against."""


def validate(value, schema, path="$"):
    """Asserts `value` satisfies `schema` (at `path`), for the subset the server supports."""
    if "const" in schema:
        assert value == schema["const"], path
    if "enum" in schema:
        assert value in schema["enum"], (path, value)
    kind = schema.get("type")
    checks = {"string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "null": lambda v: v is None, "array": lambda v: isinstance(v, list),
              "object": lambda v: isinstance(v, dict)}
    if kind:
        assert checks[kind](value), (path, kind, value)
    if kind == "object":
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            assert name in value, (path, name)
        for name, v in value.items():
            if schema.get("additionalProperties") is False:
                assert name in props, (path, name)
            if name in props:
                validate(v, props[name], f"{path}.{name}")
    if kind == "array":
        assert len(value) >= schema.get("minItems", 0), path
        assert "maxItems" not in schema or len(value) <= schema["maxItems"], path
        for i, item in enumerate(value):
            validate(item, schema.get("items", {}), f"{path}[{i}]")
