"""The Responses API: HTTP and WebSocket routes, request items → chat, events, the
response store, sealed reasoning."""
