"""Pipecat's Twilio echo agent, the peer of ``bench/vs_pipecat.py``.

Runs under Pipecat's own virtualenv (``bench/vs_pipecat.py --install-pipecat``), never
under rutster's: it imports nothing of rutster. It is the agent a Pipecat user writes
for Twilio Media Streams, from Pipecat's own Twilio examples, with the LLM and TTS left
out: FastAPI on uvicorn, the voice webhook answering TwiML ``<Connect><Stream>``, the
media socket parsed by ``parse_telephony_websocket``, ``TwilioFrameSerializer`` (8 kHz
μ-law), Silero VAD (``VADProcessor``), and a processor that sends every caller frame
back as output audio. Pipecat's defaults everywhere else (output in 40 ms packets).

Usage (what the benchmark runs): ``python bench/pipecat_twilio_echo.py --port N``
"""

from __future__ import annotations

import argparse
import sys

import uvicorn
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response
from loguru import logger
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import Frame, InputAudioRawFrame, OutputAudioRawFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.runner.utils import parse_telephony_websocket
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.transports.websocket.fastapi import (
    FastAPIWebsocketParams,
    FastAPIWebsocketTransport,
)

#: Twilio's media rate (μ-law 8 kHz).
TWILIO_RATE = 8_000


class Echo(FrameProcessor):
    """Every caller frame back to the caller, as output audio."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InputAudioRawFrame):
            await self.push_frame(
                OutputAudioRawFrame(
                    audio=frame.audio,
                    sample_rate=frame.sample_rate,
                    num_channels=frame.num_channels,
                )
            )
        else:
            await self.push_frame(frame, direction)


def app(public_host: str) -> FastAPI:
    """The agent: the voice webhook and the media socket."""
    api = FastAPI()

    @api.post("/twilio/voice")
    async def voice(request: Request) -> Response:
        twiml = (
            '<?xml version="1.0" encoding="UTF-8"?><Response><Connect>'
            f'<Stream url="ws://{public_host}/ws"/></Connect></Response>'
        )
        return Response(content=twiml, media_type="application/xml")

    @api.websocket("/ws")
    async def media(websocket: WebSocket) -> None:
        await websocket.accept()
        _, call = await parse_telephony_websocket(websocket)
        serializer = TwilioFrameSerializer(
            stream_sid=call["stream_id"],
            call_sid=call["call_id"],
            # No Twilio account here: the simulated caller hangs up itself.
            params=TwilioFrameSerializer.InputParams(auto_hang_up=False),
        )
        transport = FastAPIWebsocketTransport(
            websocket,
            FastAPIWebsocketParams(
                audio_in_enabled=True,
                audio_out_enabled=True,
                add_wav_header=False,
                serializer=serializer,
            ),
        )
        pipeline = Pipeline(
            [
                transport.input(),
                VADProcessor(vad_analyzer=SileroVADAnalyzer()),
                Echo(),
                transport.output(),
            ]
        )
        task = PipelineTask(
            pipeline,
            params=PipelineParams(
                audio_in_sample_rate=TWILIO_RATE, audio_out_sample_rate=TWILIO_RATE
            ),
        )

        @transport.event_handler("on_client_disconnected")
        async def on_client_disconnected(transport: object, client: object) -> None:
            await task.cancel()

        await PipelineRunner(handle_sigint=False).run(task)

    return api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # Pipecat logs every frame's journey at DEBUG by default; a deployment runs at
    # WARNING, as rutster serve does.
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    uvicorn.run(
        app(f"{args.host}:{args.port}"), host=args.host, port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
