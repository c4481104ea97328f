"""Custom tools' grammars the tests share (tests/test_lark_rules.py, the Responses tests)."""

from __future__ import annotations

# Codex's apply_patch grammar (codex-rs/core/src/tools/handlers/tool_apply_patch.lark)
APPLY_PATCH = r"""
start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""


def lark_oracle(grammar: str) -> str:
    """``grammar`` as the ``lark`` package's Earley parser takes it: its dynamic lexer
    refuses a terminal that can match nothing, so ``/(.*)/`` is ``/(.+)/?`` (the same
    language)."""
    return grammar.replace("/(.*)/", "/(.+)/?")
