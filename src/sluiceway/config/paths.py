"""Relative paths in configuration, read from a chosen directory instead of the current one.

A relative path in a file sluiceway reads is relative to the directory ``sluice`` runs in — except
where something else is said: a workspace file (``sluice.yaml``) is read from its own directory,
and so are the pipeline specs and capture files it lists (as if sluice ran there). These two
functions make such a path absolute; absolute paths, URIs and in-memory databases stay as they are.

>>> rooted("./data/journal", "/srv/shop")
'/srv/shop/data/journal'
>>> rooted("s3://bucket/lake", "/srv/shop")
's3://bucket/lake'
>>> rooted_dsn("sqlite:///work.db", "/srv/shop")
'sqlite:////srv/shop/work.db'
>>> rooted_dsn("postgresql://app@db/shop", "/srv/shop")
'postgresql://app@db/shop'
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from sluiceway.db.dsn import Dialect, parse_dsn


def rooted(path: str, root: str | Path) -> str:
    """``path`` from ``root`` when it is a relative local path (normalised), else as it is."""
    if "://" in path or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(os.path.abspath(root), path))


def rooted_dsn(dsn: str, root: str | Path) -> str:
    """A SQLite DSN naming a relative file, made to name it from ``root``; any other DSN as it is."""
    source = parse_dsn(dsn)
    if source.dialect is not Dialect.SQLITE or source.target == ":memory:" or os.path.isabs(source.target):
        return dsn
    return "sqlite:///" + quote(rooted(source.target, root))
