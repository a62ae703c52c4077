"""The OpenAI Realtime brain: a tap-protocol server backed by OpenAI Realtime sessions."""
