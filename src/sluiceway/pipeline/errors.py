"""Pipeline errors: one branch of the ``SluicewayError`` tree, each carrying its fields."""

from __future__ import annotations

from sluiceway.errors import ConfigError, SluicewayError


class PipelineError(SluicewayError):
    """Root of the pipeline's own errors."""


class SpecError(ConfigError):
    """A pipeline spec (YAML or Python) is invalid; ``path`` names the field (``sinks[1].table``)."""


class SinkFailed(PipelineError):
    """A sink could not write a record even one at a time: it stopped at the last good offset.

    ``offset`` is the offset of the record that failed, ``last_good`` the offset of the last
    record written before it in that batch (``None`` if it was the batch's first).
    """

    def __init__(
        self,
        sink: str,
        offset: int | None,
        error: str,
        *,
        batch_id: int | None = None,
        last_good: int | None = None,
    ) -> None:
        self.sink = sink
        self.offset = offset
        self.error = error
        self.batch_id = batch_id
        self.last_good = last_good
        at = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"sink {sink!r} failed{at}: {error}")


class StepPaused(PipelineError):
    """Raised inside a sink's batch when ``step`` has used its one-record budget (not an error)."""

    MARKER = "sluice-step-paused"

    def __init__(self, sink: str) -> None:
        self.sink = sink
        super().__init__(f"{self.MARKER}: sink {sink!r} processed its step")


class SourceError(PipelineError):
    """A source could not be read (missing journal, unreachable broker or database)."""
