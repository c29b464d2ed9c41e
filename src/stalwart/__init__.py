"""Stalwart keeps large distributed training runs productive through failures."""

__version__ = "0.1.0"
