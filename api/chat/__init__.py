"""The chat path chat completions, the Responses API and Anthropic's messages share:
message validation and rendering, tools and response formats → grammar, and ``prepare``
(render, tokenize, grammar on the prepare pool)."""
