"""GET /: the playground, a chat page served by llamaserve itself.

One self-contained file (``playground.html``: markup, style and script, no third-party
code, nothing fetched from elsewhere), so it works offline. It talks to the server only
through the public API a client would use (``/v1/models``, ``/v1/chat/completions``
streaming, ``/metrics``), sending the API key the user typed once when the server asks
for one. ``server.playground: false`` turns it off (404).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from api.web.errors import APIError
from api.web.state import ServerState

PAGE = Path(__file__).with_name("playground.html")
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
                               "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' "
                               "data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


@cache
def _page() -> str:
    return PAGE.read_text("utf-8")


async def playground(request: Request) -> Response:
    state: ServerState = request.app.state.llama
    if not state.config.server.playground:
        raise APIError(f"Unknown path: GET {request.url.path}", status=404)
    return HTMLResponse(_page(), headers=HEADERS)
