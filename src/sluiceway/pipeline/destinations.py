"""Where a pipeline's sinks write, and the rule that no two of them write to the same place.

A file, journal or table sink owns its destination. Two parquet sinks with one ``path`` are two
queries reading the same records, so every record lands there twice, and nothing fails to say so;
a directory inside another sink's directory is read as part of it (a Delta ``VACUUM`` even deletes
what it does not know); a sink writing into the checkpoint directory mixes its files with Spark's
checkpoints. So a spec is refused at load when two of its places overlap. Paths are compared as
the pipeline will use them: relative to the current directory, normalised (``./out`` and ``out/``
are one directory). A sink whose records may meet another's by design (a topic, a table upserted
by key) owns no place.

>>> lake = Place.of_path("lake", "sinks[0].path", "./out")
>>> copy = Place.of_path("copy", "sinks[1].path", "out/")
>>> check_places([lake, copy], checkpoint="./cp", reserved=["lake", "copy"])
Traceback (most recent call last):
...
ValueError: sinks[1].path: sinks 'lake' (./out) and 'copy' (out/) both write to the same directory: every record would be written twice; give each sink its own path
"""  # noqa: E501

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Place:
    """What one sink writes to, as written (``shown``) and as compared (``key``)."""

    #: The sink, or its dead-letter sink (``lake.dead_letter``).
    sink: str
    #: The field an error names (``sinks[1].path``).
    field: str
    shown: str
    key: str
    #: What it is, in an error: ``directory``, ``location`` (a URI), ``table``.
    noun: str

    @property
    def directory(self) -> bool:
        """A local directory: one inside another overlaps it too."""
        return self.noun == "directory"

    @classmethod
    def of_path(cls, sink: str, field: str, path: str) -> Place:
        """A directory, or an object-store URI (``s3://bucket/t``: compared without a trailing ``/``)."""
        if "://" in path:
            return cls(sink, field, path, path.rstrip("/"), "location")
        return cls(sink, field, path, local_key(path), "directory")

    @classmethod
    def of_table(cls, sink: str, field: str, shown: str, key: str) -> Place:
        """A table in a catalog (``key`` names the catalog and the table)."""
        return cls(sink, field, shown, key, "table")


def local_key(path: str) -> str:
    """A local path as the pipeline will use it: absolute from the current directory, normalised."""
    return os.path.normpath(os.path.abspath(path))


def _inside(inner: str, outer: str) -> bool:
    return PurePosixPath(outer) in PurePosixPath(inner).parents


def check_places(places: Sequence[Place], *, checkpoint: str, reserved: Iterable[str]) -> None:
    """Raise ``ValueError("<field>: …")`` for the first two places that overlap, or for a sink
    directory that overlaps the checkpoint directory's ``reserved`` entries (one per sink, and the
    capture journal): the directory itself, one inside those entries, or one holding the checkpoints."""
    for i, later in enumerate(places):
        for earlier in places[:i]:
            if later.key == earlier.key:
                raise ValueError(f"{later.field}: {_same(earlier, later)}")
            if later.directory and earlier.directory:
                inner, outer = (later, earlier) if _inside(later.key, earlier.key) else (earlier, later)
                if _inside(inner.key, outer.key):
                    raise ValueError(
                        f"{later.field}: sink {inner.sink!r} writes to {inner.shown}, inside sink "
                        f"{outer.sink!r}'s directory {outer.shown} (each would read the other's "
                        "files as its own); give each sink a directory of its own, side by side"
                    )
    root = local_key(checkpoint)
    kept = [os.path.join(root, name) for name in reserved]
    for place in places:
        if not place.directory:
            continue
        if place.key == root:
            raise ValueError(
                f"{place.field}: sink {place.sink!r} writes to the checkpoint directory {checkpoint}; "
                "give the sink a directory outside it"
            )
        if _inside(root, place.key):
            raise ValueError(
                f"{place.field}: sink {place.sink!r} writes to {place.shown}, which holds the "
                f"checkpoint directory {checkpoint}; give the sink a directory outside it"
            )
        if any(place.key == entry or _inside(place.key, entry) for entry in kept):
            raise ValueError(
                f"{place.field}: sink {place.sink!r} writes to {place.shown}, where the checkpoint "
                f"directory {checkpoint} keeps a sink's checkpoints; give the sink a directory outside it"
            )


def _same(earlier: Place, later: Place) -> str:
    if earlier.shown == later.shown:
        both = f"sinks {earlier.sink!r} and {later.sink!r} both write to {earlier.shown}"
    else:
        both = (
            f"sinks {earlier.sink!r} ({earlier.shown}) and {later.sink!r} ({later.shown}) "
            f"both write to the same {earlier.noun}"
        )
    # Two sinks' queries read the same records; a dead-letter sink gets other records than its
    # neighbour, which would land among that one's.
    dead = any(".dead_letter." in place.field for place in (earlier, later))
    harm = "their records would be mixed" if dead else "every record would be written twice"
    own = later.field.rsplit(".", 1)[-1]
    return f"{both}: {harm}; give each sink its own {own}"
