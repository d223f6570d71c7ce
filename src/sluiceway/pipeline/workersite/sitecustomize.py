"""Run by every Python process a local Spark starts for us (its workers, data source planners and
streaming source runner), before their own module: import PySpark from the installed package,
not from Spark's ``pyspark.zip``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on each worker's ``PYTHONPATH``. Python
cannot cache bytecode for a zip, so every such process compiled PySpark from source again: about
0.6 s of CPU each, and one of them (the streaming source runner) starts with every query, before
its first micro-batch. Where the same PySpark version is installed as a package (``pip install
pyspark``: the zip is a copy of it), the zip is taken off the path and the package's cached
bytecode is used. Anything else (another version, no package) leaves the path as Spark made it.

:func:`sluiceway.pipeline.session.build_session` puts this directory on the workers' path, for
local masters only. A ``sitecustomize`` found further along the path (the interpreter's own) is
run afterwards, as Python would have run it.
"""

from __future__ import annotations

import os
import sys


def _installed_pyspark_instead_of_zip() -> None:
    zips = [p for p in sys.path if os.path.basename(p) == "pyspark.zip"]
    if not zips:
        return
    from importlib.machinery import PathFinder

    rest = [p for p in sys.path if p not in zips]
    spec = PathFinder.find_spec("pyspark", rest)
    if spec is None or not spec.origin:
        return
    import zipfile

    try:
        with zipfile.ZipFile(zips[0]) as z:
            zipped = z.read("pyspark/version.py")
        with open(os.path.join(os.path.dirname(spec.origin), "version.py"), "rb") as fh:
            installed = fh.read()
    except (OSError, KeyError, zipfile.BadZipFile):
        return
    if zipped == installed:
        sys.path[:] = rest


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, as if this one were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    from importlib.machinery import PathFinder

    others = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _installed_pyspark_instead_of_zip()
finally:
    _chain()
