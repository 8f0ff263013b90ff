"""The live dashboard: one static page that draws the monitor API's figures as SVG.

``GET /dashboard`` serves it (open: the page holds no data); the page reads processors,
generations, lag, processing stats and replays from ``/v1`` with a ``query`` API key, given
once in the URL fragment (``/dashboard#key=...``, never sent to the server in a URL).
"""

from refold.services.dashboard.routes import dashboard_router

__all__ = ["dashboard_router"]
