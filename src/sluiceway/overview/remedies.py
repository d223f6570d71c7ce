"""What clears a part's trouble: the command or console action for each kind of problem.

Pure: an entry in, sentences out (the console shows them under the part's last error). They
name the commands of the CLI as a user types them; the files are the workspace's.
"""

from __future__ import annotations

import shlex

from sluiceway.overview.report import (
    CaptureEntry,
    Entry,
    FeedEntry,
    Health,
    JournalEntry,
    OutboxEntry,
    PipelineEntry,
)


def remedies(entry: Entry) -> list[str]:
    """How to clear what ``entry``'s health says (``[]`` when it is ok)."""
    if entry.health is Health.OK:
        return []
    if entry.error is not None:
        return [f"it clears by itself once this can be read again: {_unreadable(entry)}"]
    if isinstance(entry, OutboxEntry):
        found = []
        if entry.leader is None:
            found.append("no harvester leads: start one, sluice reap -f reaper.yaml")
        else:
            found.append("the harvester is behind: see its log and its sluice_harvest_* metrics")
        if entry.dead_letters:
            found.append("dead letters: retry or resolve each below (sluice outbox dead retry|resolve)")
        return found
    if isinstance(entry, JournalEntry):
        return ["a consumer is behind: start or speed up the pipeline that reads as it"]
    if isinstance(entry, PipelineEntry):
        found = []
        for sink in entry.sinks or []:
            if sink.error is not None:
                found.append(
                    f"sink {sink.name} stopped: fix the cause and step it (sluice pipeline step "
                    f"{entry.spec} --sink {sink.name}), or skip the record (sluice pipeline skip "
                    f"{entry.spec} --sink {sink.name} --offset N): the buttons below do the same"
                )
        return found or ["a sink is behind: is sluice pipeline run running, and keeping up?"]
    if isinstance(entry, FeedEntry):
        found = []
        if entry.expired_leases:
            found.append("leases ran out: a worker died or is stuck; a running worker takes them over")
        failed = (entry.items_by_status or {}).get("failed")
        if failed:
            found.append("failed items: retry them (the retry form below, or sluice feed retry)")
        return found or ["see the problems above"]
    if isinstance(entry, CaptureEntry):
        found = []
        if entry.refusals is not None and entry.refusals.stuck is not None:
            where = shlex.quote(str(entry.refusals.stuck.get("lsn")))
            found.append(
                f"the destination refuses a change: sluice capture inspect -f {entry.file}, then "
                f"sluice capture skip -f {entry.file} --lsn {where} "
                "(or set deadLetter: in the file)"
            )
        if entry.leader is None or (entry.slot is None and not entry.reads_binlog):
            found.append(f"no capture is running: sluice capture -f {entry.file}")
        return found or ["the capture is behind: see its log and sluice_capture_* metrics"]
    return []


def _unreadable(entry: Entry) -> str:
    if isinstance(entry, OutboxEntry | FeedEntry):
        return "check the database is up and the DSN in the workspace file"
    if isinstance(entry, JournalEntry):
        return "check the journal's path"
    return "check the file it names, and the database it reads"
