"""Elections in tests: a listener that records what an election tells it, in order."""

from __future__ import annotations


class Events:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def leader_acquired(self, epoch: int) -> None:
        self.seen.append(f"acquired {epoch}")

    def leader_revoked(self) -> None:
        self.seen.append("revoked")

    def leader_fenced(self) -> None:
        self.seen.append("fenced")
