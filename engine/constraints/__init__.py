"""Constraints on what a model may write, as GBNF for llama.cpp's grammar sampler: JSON
Schemas made exact or refused (``json_schema`` with ``schema_merge``, ``schema_numbers``,
``schema_patterns``), a JSON value or tool calls in a family's own markup (``grammar``,
``grammar_shapes``, ``grammar_gemma4``), and custom tools' Lark and regex grammars
(``lark_rules``, ``regex_rules``). Pure Python; the sampling side is ``engine.sampling``."""
