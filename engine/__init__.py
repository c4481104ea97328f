"""The engine: the only package that touches llama.cpp (see docs/ARCHITECTURE.md)."""

import sys

# jsonschema imports rfc3987_syntax wherever it is installed (its format-nongpl extra): that
# builds a Lark grammar at import, 1.3 s of CPU and 21 MiB resident (17 MiB of an idle
# server's RSS) for the life of the process, to check two formats (`iri`,
# `iri-reference`) that the grammar writes as URIs anyway (ASCII, a subset); the server
# checks those itself (engine/constraints/schema_values.py). Left out, so the server's start
# and idle memory do not depend on what else the environment holds.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
