"""Observability: Prometheus metrics, shipped alert rules, notifications and the web dashboard.

Everything here reads ledgers and never writes them; servers bind to loopback by default.
"""

LOOPBACK = "127.0.0.1"  # the address every server binds unless told otherwise
