"""Database dialects: DSN parsing, connections, named SQL and identifier quoting."""

from sluiceway.db.connection import Database, map_db_error
from sluiceway.db.dsn import DataSource, Dialect, dsn_warnings, parse_dsn
from sluiceway.db.failures import classify
from sluiceway.db.identifiers import check_identifier, quote_identifier
from sluiceway.db.listen import Listener
from sluiceway.db.queries import QuerySet, load_queries, parse_blocks

__all__ = [
    "DataSource",
    "Database",
    "Dialect",
    "Listener",
    "QuerySet",
    "check_identifier",
    "classify",
    "dsn_warnings",
    "load_queries",
    "map_db_error",
    "parse_blocks",
    "parse_dsn",
    "quote_identifier",
]
