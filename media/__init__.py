"""Sans-I/O media: G.711/L16 codecs, streaming resampling, framing, playout and pacing.

Nothing in this package does I/O or reads a clock; time is always passed in.
"""
