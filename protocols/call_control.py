"""Provider call control: what the core may ask of a live call outside its media stream.

Tools act on the call itself: hanging up, transferring. Each provider does
that its own way (Twilio: its REST API; SIP: BYE and REFER), so the core
talks to this protocol and each trunk adapter supplies an implementation.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

#: Channel state reported after a successful hang-up.
CHANNEL_COMPLETED = "completed"
#: Channel state reported after a successful transfer request.
CHANNEL_TRANSFERRING = "transferring"


class CallControlFailure(Exception):
    """A provider refused or failed a call-control request.

    ``reason`` is a short stable label (``already_ended``, ``auth_failed``,
    ``timeout``, ``network``, ``http_error``, ``bad_call_id``…) safe for
    receipts and metrics; the message never carries credentials.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RestCallControlError(CallControlFailure):
    """A provider's REST API refused or failed a call-control request; ``status_code``
    is the HTTP status when there was an answer."""

    def __init__(self, reason: str, message: str, *, status_code: int | None = None) -> None:
        super().__init__(reason, f"{reason}: {message}")
        self.status_code = status_code


class ProviderCallControl(Protocol):
    """Hang up or transfer one live call (``call_id`` is the provider's id for it)."""

    async def hang_up(self, call_id: str) -> str:
        """End the call; return the channel state. Raises :class:`CallControlFailure`."""

    async def transfer(self, call_id: str, destination: str) -> str:
        """Connect the caller to ``destination`` (E.164 or SIP URI) instead of the brain."""


@runtime_checkable
class SupportsGoodbye(Protocol):
    """Call control that can play a short spoken goodbye, then hang up (Twilio: ``<Say>``)."""

    async def say_and_hang_up(self, call_id: str, text: str) -> str:
        """Speak ``text`` to the caller, then end the call; return the channel state."""
