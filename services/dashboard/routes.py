"""``dashboard_router``: ``GET /dashboard`` and the page's own script and style sheet.

The page is static: HTML, JavaScript and CSS shipped as package data (``static/``), read once
when the router is built. Its figures come from the monitor API (``/v1/processors``, their
``lag`` and ``stats``, ``/v1/replays``), fetched by the browser every two seconds with the
API key the user gave in the URL fragment; the page draws its charts as SVG itself, so it
needs no CDN and no download.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

__all__ = ["DASHBOARD_PATH", "dashboard_router"]

DASHBOARD_PATH = "/dashboard"

# The page's files: name -> media type. Only these are served (no path from the request
# reaches the file system).
_ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# Same origin only and no inline code: the API key in sessionStorage is readable by scripts
# of this page alone, and the page cannot be framed (clickjacking).
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    # Revalidated on each load: a new release's page and script are picked up together.
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return (resources.files("refold.services.dashboard") / "static" / name).read_bytes()


def dashboard_router() -> APIRouter:
    """The router of the dashboard page (no authentication: the page itself holds no data).

    Returns:
        ``GET /dashboard`` (the HTML page) and ``GET /dashboard/static/{dashboard.js,
        dashboard.css}``, left out of the OpenAPI schema (they are not part of the API).
    """
    page = _read("dashboard.html")
    assets = {name: (_read(name), media_type) for name, media_type in _ASSETS.items()}
    router = APIRouter(include_in_schema=False)

    @router.get(DASHBOARD_PATH, response_class=HTMLResponse)
    def dashboard() -> Response:
        """The dashboard page."""
        return Response(page, media_type="text/html; charset=utf-8", headers=_SECURITY_HEADERS)

    def _asset_route(name: str, body: bytes, media_type: str) -> None:
        @router.get(f"{DASHBOARD_PATH}/static/{name}", name=f"dashboard_{name}")
        def asset() -> Response:
            return Response(body, media_type=media_type, headers=_SECURITY_HEADERS)

    for name, (body, media_type) in assets.items():
        _asset_route(name, body, media_type)
    return router
