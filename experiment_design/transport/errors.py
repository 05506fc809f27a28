"""Errors of the participant-to-participant data path."""

from __future__ import annotations

from experiment_design.errors import TracrError


class TransportError(TracrError):
    """The data path failed: the peer is unreachable, closed, or spoke out of turn."""


class AuthError(TransportError):
    """The peer could not prove it holds the run's secret (or we could not verify it)."""


class ProtocolError(TransportError):
    """The peer sent bytes that are not a valid tracr frame (garbage, absurd sizes)."""


class ChannelClosed(TransportError):
    """The peer closed the connection between two frames (an orderly end)."""


class IntegrityError(TransportError):
    """A frame's tag did not verify: it was altered, replayed, reordered or dropped on the way."""
