"""Anthropic's messages API (``/v1/messages``) over the chat path."""
