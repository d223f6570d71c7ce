"""A spec's settings for client libraries (Spark, Spark data sources, pyiceberg, delta-rs) take
YAML's numbers and true/false as the text the library parses, as librdkafka settings do.

``spark: {spark.sql.shuffle.partitions: 4}`` was refused with "Input should be a valid string".
"""

from __future__ import annotations

import yaml

from sluiceway.pipeline import PipelineSpec
from sluiceway.pipeline.spec import DeltaSinkSpec, IcebergSinkSpec

SPEC = """\
pipeline:
  name: orders
  source: {type: journal, path: ./data/journal, options: {maxFilesPerTrigger: 10}}
  sinks:
    - {name: t, type: iceberg, table: shop.orders, catalog: {type: sql, uri: "sqlite:///c.db", echo: false}}
    - {name: d, type: delta, path: ./lake/orders, storage_options: {timeout: 30}}
  checkpoint: ./data/cp
  spark: {spark.sql.shuffle.partitions: 4, spark.ui.enabled: false, spark.memory.fraction: 0.5}
"""


def test_numbers_and_booleans_are_written_as_text() -> None:
    spec = PipelineSpec.from_dict(yaml.safe_load(SPEC), source="orders.yaml", env={})
    assert spec.spark == {
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        "spark.memory.fraction": "0.5",
    }
    assert spec.source.options == {"maxFilesPerTrigger": "10"}
    iceberg, delta = spec.sinks
    assert isinstance(iceberg, IcebergSinkSpec) and iceberg.catalog["echo"] == "false"
    assert isinstance(delta, DeltaSinkSpec) and delta.storage_options == {"timeout": "30"}
