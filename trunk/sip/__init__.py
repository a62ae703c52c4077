"""SIP legs: pjsua2 worker processes bridged to the gateway over the internal media WebSocket."""
