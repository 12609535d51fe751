"""Fixtures of more than one system test module (the session-wide ones are in tests/)."""

from secured_stack import secured

__all__ = ["secured"]
