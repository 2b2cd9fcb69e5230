"""The server app with its own pipeline on a free 127.0.0.1 port, for the benches that drive
it through its network interfaces (--webrtc, --http)."""

from __future__ import annotations

import contextlib
import socket


@contextlib.asynccontextmanager
async def loopback_server(stack, config):
    """Yields (base URL, pipeline); everything is stopped on exit."""
    from aiohttp import web

    from kimiaudio.pipeline.pipeline import Pipeline
    from kimiaudio.server.app import create_app

    pipeline = Pipeline(stack, config)
    await pipeline.start()
    runner = web.AppRunner(create_app(config, stack, pipeline), access_log=None)
    try:
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))  # a free loopback port, known before the site starts
        await web.SockSite(runner, sock).start()
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", pipeline
    finally:
        await runner.cleanup()
        await pipeline.stop()
