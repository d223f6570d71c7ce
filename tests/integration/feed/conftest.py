"""The feed's fixtures, shared with the contract tests: tables of their own for each test."""

from tests.contract.feed.conftest import feed, prefix

__all__ = ["feed", "prefix"]
