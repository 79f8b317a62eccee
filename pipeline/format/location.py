"""Where data lives: a local path, or an fsspec URL (``s3://bucket/run``), never confused.

A URL is never taken for a local path (docs/DESIGN: every DIR and MANIFEST may be a URL).
"""

from __future__ import annotations


def is_url(path: str) -> bool:
    return "://" in path
