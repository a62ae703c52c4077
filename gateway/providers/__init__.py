"""The ingress providers this gateway serves: one line each in :data:`REGISTRY`.

Adding a provider: its sans-I/O pieces (stream codec, signatures, REST client)
in a new ``trunk/<provider>/`` folder, its adapter implementing
:class:`~gateway.ingress_provider.IngressProvider` in
``gateway/providers/<provider>.py``, and one line below. The admission path
(``gateway/admission.py``), the media-socket handler
(``gateway/media_socket.py``), the REST API and the spend gate serve it
unchanged; its price goes in the price table under its name (docs/SPEND.md).
"""

from __future__ import annotations

from rutster.gateway.provider_registry import ProviderRegistry
from rutster.gateway.providers.phone import PhoneProvider
from rutster.gateway.providers.plivo import PlivoProvider
from rutster.gateway.providers.sip import SipProvider
from rutster.gateway.providers.telnyx import TelnyxProvider
from rutster.gateway.providers.twilio import TwilioProvider
from rutster.gateway.providers.vonage import VonageProvider

REGISTRY = ProviderRegistry(
    [
        TwilioProvider(),
        SipProvider(),
        TelnyxProvider(),
        PlivoProvider(),
        VonageProvider(),
        PhoneProvider(),
    ]
)
