"""The subset of JSON Schema the serving gate's closed, bounded schemas use (type, enum,
maxLength/minLength, minimum/maximum, properties, required, additionalProperties: false), as a validator
that lists what is wrong. Stdlib only, so it runs where the gate runs: on the node, uploaded beside
serving_gate.py, which imports it from its own folder (no jsonschema package there).
"""

TYPES = {"string": str, "number": (int, float), "integer": int, "object": dict, "array": list, "boolean": bool}


def schema_errors(value, schema):
    """What in ``value`` breaks ``schema`` (empty: it validates); nested properties are named ``key: ...``."""
    errors = []
    kind = schema.get("type")
    want = TYPES.get(kind)
    if want and (not isinstance(value, want) or (kind in ("number", "integer") and isinstance(value, bool))):
        return [f"expected {kind}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"longer than {schema['maxLength']}")
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"shorter than {schema['minLength']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{value} > maximum {schema['maximum']}")
    if kind == "object":
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"missing {key}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += [f"{key}: {e}" for e in schema_errors(value[key], sub)]
        if schema.get("additionalProperties") is False:
            errors += [f"unexpected {k}" for k in value if k not in schema.get("properties", {})]
    return errors
