"""Spark's local Python workers import the installed PySpark, not Spark's zip of it
(sluiceway/pipeline/workersite/sitecustomize.py), and only when the two are the same version."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pyspark

SITE = Path(__file__).resolve().parents[3] / "src" / "sluiceway" / "pipeline" / "workersite"
SPARK_ZIP = Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"


def run_python(code: str, *path: Path) -> str:
    """What a new interpreter with ``path`` as PYTHONPATH prints running ``code``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def where_pyspark_comes_from(*path: Path) -> str:
    """The file ``pyspark`` is imported from by a new interpreter with ``path`` as PYTHONPATH."""
    return run_python("import pyspark; print(pyspark.__file__)", *path)


def test_spark_zip_first_on_the_path_is_replaced_by_the_installed_package() -> None:
    assert SPARK_ZIP.exists()
    assert "pyspark.zip" in where_pyspark_comes_from(SPARK_ZIP)  # as Spark starts its workers
    assert where_pyspark_comes_from(SPARK_ZIP, SITE) == pyspark.__file__


def test_a_zip_of_another_version_is_left_where_spark_put_it(tmp_path: Path) -> None:
    other = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(SPARK_ZIP) as src, zipfile.ZipFile(other, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "pyspark/version.py":
                data = b'__version__: str = "0.0.1"\n'
            dst.writestr(item, data)
    assert str(other) in where_pyspark_comes_from(other, SITE)


def test_the_interpreters_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS_RAN = True\n")
    out = run_python(
        "import builtins, pyspark; print(builtins.THEIRS_RAN, pyspark.__file__)", SPARK_ZIP, SITE, theirs
    )
    assert out.split() == ["True", pyspark.__file__]
