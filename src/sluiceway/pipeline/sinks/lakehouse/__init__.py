"""Table-format sinks: Delta Lake (``type: delta``) and Apache Iceberg (``type: iceberg``),
exactly once per micro-batch.

Every batch is one table commit carrying a marker — this sink, this checkpoint's life, the batch
id (:mod:`~sluiceway.pipeline.sinks.lakehouse.port`). Before a batch runs, the driver reads the
marker back: a batch at or below it was committed by an attempt that died before Spark's own
checkpoint, and is skipped. Two ways a batch is written, neither bringing its records to the
driver:

* **Files from the executors** (``mode: append``, the record's own columns, a table on a local
  file system): Spark's Parquet writer writes the batch from its tasks into a staging directory
  beside the table; the driver moves the files into the table and adds them in one commit. Each
  attempt names its files afresh, so a file a committed version lists is never written over; a
  file moved by an attempt that died before its commit is in no table version (readers never
  see it; a vacuum removes it). A retry first reads the marker: the commit of the attempt before
  may have landed though its call failed.
* **One task** (``mode: mirror``; ``columns: json``; a table in an object store): the batch, sorted
  by offset, goes to one Spark task, which shapes it (:mod:`~sluiceway.pipeline.sinks.lakehouse.shape`),
  reads the marker again and commits through the format's own library — ``MERGE`` for the mirror —
  like the journal sink's single writer. A concurrent ``MERGE`` of parts of one batch would be
  two commits, not one.

A table sink stops rather than blame a record: it never writes part of a batch, so there is no
record-by-record replay and no dead-letter sink. A batch that does not fit the table (a column's
type changed, a value that is not a JSON object) stops the sink with one line.
"""
