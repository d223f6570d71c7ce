"""Sink writers (journal, kafka, postgres, parquet/json/csv, console, feed) and the batch handler."""
