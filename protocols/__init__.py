"""The protocols the core speaks, sans-I/O: the tap protocol to brains (``tap``) and
the tools the core offers them (``tool_catalog``), the provider-neutral ingress
events a call's edge delivers (``ingress``) and the call control an edge offers
(``call_control``).

Above ``rutster.media`` and ``rutster.base`` only; spend, the providers, the brains
and the gateway build on it (the layers are checked by import-linter, pyproject.toml).
"""
