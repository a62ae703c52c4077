"""Audio the shipped tools play by default, installed with the package.

``rutster demo`` and ``rutster sip-load`` speak :data:`CALLER_SPEECH_8K` as the
caller when no other audio is given. Its source and licence are in
``README.md`` beside it; the test suite reads the same file
(``tests/fixtures/audio/caller_speech_8k.wav`` is a link to it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

__all__ = ["CALLER_SPEECH_8K"]

#: 30 s of real recorded English speech, 8 kHz mono PCM16 (silero-vad's
#: ``aepyx_8k.wav``, MIT; README.md here).
CALLER_SPEECH_8K: Final = Path(__file__).resolve().with_name("caller_speech_8k.wav")
