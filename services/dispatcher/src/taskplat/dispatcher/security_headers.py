"""Security headers on every answer of the dispatcher: the dashboard and the API.

Invariants: every HTTP response carries a Content-Security-Policy (the dashboard under `/ui/`
may load only its own files and call only its own origin: no inline script or style, no
framing; every other answer is data and may load nothing), `X-Content-Type-Options: nosniff`,
`Referrer-Policy: no-referrer` and `X-Frame-Options: DENY`. Headers a route set itself are kept.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

UI_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
API_POLICY = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'"
COMMON: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        policy = UI_POLICY if path == "/ui" or path.startswith("/ui/") else API_POLICY
        added = ((b"content-security-policy", policy.encode()), *COMMON)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in added if name not in present]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
