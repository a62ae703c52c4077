"""The bottom layer: vocabulary and utilities every other package may use.

Retry backoff, environment and secret-file parsing, WebSocket close codes,
the one-line log format and the per-call stream token. Nothing here imports
another rutster package (the layers are checked by import-linter, pyproject.toml).
"""
