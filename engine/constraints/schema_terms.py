"""The words every JSON Schema module here shares: the keyword groups, the limits that keep
a grammar within what llama.cpp can hold, and the errors. Pure Python."""

from __future__ import annotations

ANY_TYPES = ["string", "number", "integer", "boolean", "object", "array", "null"]
TYPES = {*ANY_TYPES}
ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated",
               "readOnly", "writeOnly", "$schema", "$id", "$anchor", "discriminator",
               "strict", "$defs", "definitions", "nullable", "contentEncoding",
               "contentMediaType", "contentSchema", "$vocabulary", "$dynamicAnchor"}
NUMERIC = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
# validation keywords enforced only where the shape allows it (_Localizer._special)
SPECIAL = ("not", "if", "then", "else", "patternProperties", "dependentRequired",
           "dependentSchemas", "dependencies", "uniqueItems", "minProperties",
           "maxProperties", "propertyNames", "contains", "minContains", "maxContains",
           "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef")

SCHEMA_MAPS = ("properties",)  # name -> schema
# (walker -> writers) the pattern every other key of an object matches: a map's
# `patternProperties` (schema_keywords._map_keys); never taken from a request's schema
KEY_PATTERN = "$keyPattern"
# (walker -> writers) how many entries a map (an object with no declared property, its other
# keys under one schema) holds: [low (0 or 1), high or None] (schema_keywords._entries)
ENTRY_COUNT = "$entryCount"
# (walker -> writers) an array whose items are distinct listed values: each at most once, in
# the order listed: [values, low (0 or 1)] (schema_keywords._distinct)
DISTINCT = "$distinct"
DISTINCT_LIMIT = 64  # listed values an array of distinct ones is written for
MARKERS = (ENTRY_COUNT, DISTINCT)  # passed through the walk as they are
# the words that apply to one type only, as the walk writes them (a type list is spread into
# one branch per type: a string's pattern, or a map's markers, are nothing to an integer)
BY_TYPE = {"string": {"pattern", "minLength", "maxLength", "format"},
           "array": {"items", "prefixItems", "minItems", "maxItems", DISTINCT},
           "object": {"properties", "required", "additionalProperties", KEY_PATTERN,
                      ENTRY_COUNT},
           "integer": {*NUMERIC, "$places"}, "number": {*NUMERIC, "$places"}}
# keywords that say nothing of a value of another type than theirs
OBJECT_ONLY = ("minProperties", "maxProperties", "propertyNames", "patternProperties",
               "dependentRequired", "dependencies", "dependentSchemas", "unevaluatedProperties")
ARRAY_ONLY = ("uniqueItems", "contains", "minContains", "maxContains", "unevaluatedItems")
COUNTS = ("minItems", "maxItems", "minLength", "maxLength")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_VALUES = ("items", "additionalProperties")
KEYWORDS = {*SCHEMA_MAPS, *COUNTS, *SCHEMA_LISTS, *SCHEMA_VALUES, *NUMERIC, *SPECIAL,
            "type", "enum", "const", "required", "pattern", "format", "$ref"}
# llama.cpp sees a count n as n nested rules: past this it is not enforced (relaxed)
ENUM_LIMIT = 1000  # past this, an enum is relaxed to the types of its values
MAX_SCHEMA_NODES = 20_000  # subschemas in one schema, $ref targets counted once
# the converter's rules for optional properties grow with their square (and recurse)
MAX_OPTIONAL_PROPERTIES = 300


class SchemaError(ValueError):
    """A schema that cannot become a grammar; the message names the keyword."""


class Unsatisfiable(SchemaError):
    """A (sub)schema no value can match: an optional property under it is left out."""
