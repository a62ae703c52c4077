"""Call ingress adapters: one subpackage per way a call can arrive (twilio, later sip, ...).

Every adapter turns its provider's wire protocol into the provider-neutral
events of :mod:`trunk.events`, so the core has one ingress contract.
"""
