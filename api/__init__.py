"""The HTTP side: ``web`` (the app and its plumbing), ``openai``, ``responses`` and
``anthropic`` (each API's routes), ``chat`` (the chat path they share), ``media`` (images
and audio of a request). A model is reached only through ``engine.handle.ModelHandle``."""
