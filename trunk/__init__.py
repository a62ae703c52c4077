"""Call ingress adapters: one subpackage per way a call can arrive (twilio, sip).

Every adapter turns its provider's wire protocol into the provider-neutral
events of :mod:`rutster.protocols.ingress`, so the core has one ingress contract.
"""
