"""The shipped tools, on top of every layer: the ``rutster`` command (``cli``), the process
launcher, the Twilio simulator, the offline demo, the tap conformance kit, the MOCK OpenAI
Realtime server and its voice, the marker tone, the pjsua2 test phone and the SIP load test.

They stand beside the gateway and the brains and may use both; nothing in the product
packages imports them (the layers are checked by import-linter, pyproject.toml). Test-only
doubles live in ``tests/support/``, never here.
"""
