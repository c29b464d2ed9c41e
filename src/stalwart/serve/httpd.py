"""The servers of serve/ use the one HTTP server of :mod:`stalwart.http_server` (its limits in one place)."""

from ..http_server import (
    JSON,
    LOOPBACK,
    App,
    HttpError,
    HttpServer,
    Limits,
    Reply,
    Request,
    content_length,
    is_loopback,
    serve_until_signal,
    warn_if_exposed,
)

__all__ = [
    "JSON",
    "LOOPBACK",
    "App",
    "HttpError",
    "HttpServer",
    "Limits",
    "Reply",
    "Request",
    "content_length",
    "is_loopback",
    "serve_until_signal",
    "warn_if_exposed",
]
