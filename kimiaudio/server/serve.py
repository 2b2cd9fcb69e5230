"""`python -m kimiaudio serve`: load the model, serve, and stop gracefully on SIGTERM/SIGINT.

Stopping, in order:
1. stop admitting: new offers and requests get 503 (session_registry.py, middleware/draining.py),
   /readyz says not ready;
2. let the answers in flight finish, the sessions' and the /v1 requests' (context.py's
   AnswersInFlight), for at most `server.shutdown_grace_s` (a second signal cuts the wait short);
3. cut the /v1 answers still running: each client is told so (503 `shutting_down`, an `error`
   event in a stream open already; v1/turn_guard.py), and they are given ANSWER_CUT_S to say it;
4. close the listener and every session: an answer still playing is cut there and stored with
   what was heard (app.py's on_shutdown), peers are closed; the requests still open (none of
   them an answer by now) are given HTTP_SHUTDOWN_TIMEOUT_S, then cancelled;
5. stop the pipeline and the store (cleanup contexts) and exit 0.

What stops a start (certificate files, an API key, the address, the database) is checked before
the model and the server's own modules (torch, transformers: seconds) are imported: a refused
start says why at once. So this module imports them where they are first needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import ssl
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from aiohttp import web

from kimiaudio.config import Config
from kimiaudio.errors import KimiAudioError
from kimiaudio.server.middleware.access import LOOPBACK_HOSTS, AccessPolicy, exposure_warning, key_warning
from kimiaudio.server.routes.page_files import check_page_files
from kimiaudio.server.tls import ssl_context, validity_warning
from kimiaudio.store import database_location
from kimiaudio.store.location import shown

if TYPE_CHECKING:
    from kimiaudio.server.context import ServerContext

log = logging.getLogger(__name__)

# aiohttp waits this long for the requests still open when the listener closes (the answers
# have ended in the drain), then cancels them and waits as long again.
HTTP_SHUTDOWN_TIMEOUT_S = 5.0
ANSWER_CUT_S = 5.0  # for the /v1 answers cut at the grace's end to end their streams
POLL_S = 0.1  # sessions say whether they are answering by a property, not an event


def banner(config: Config, stack, warnings: list[str]) -> str:
    from kimiaudio.pipeline.model_stack import DEMO_NOTICE

    host = config.server.host
    display_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    scheme = "https" if config.server.tls_cert else "http"
    lines = [
        "",
        f"  kimiaudio is ready: open {scheme}://{display_host}:{config.server.port}/ and press Connect",
        f"  model: {stack.paths.root}",
        f"  device: {stack.device} ({str(stack.dtype).removeprefix('torch.')})",
        f"  conversations: {shown(database_location(config))}",
    ]
    if stack.is_demo:
        lines += ["", "  " + DEMO_NOTICE]
    if host not in LOOPBACK_HOSTS and scheme == "http":
        lines += [
            "",
            "  note: browsers allow the microphone only on https:// or localhost pages "
            "(server.tls_cert and tls_key serve HTTPS)",
        ]
        if not config.server.allowed_hosts:
            lines += [
                "  note: only requests for localhost and the bound address are served; add the names clients "
                "use to server.allowed_hosts"
            ]
    for warning in warnings:
        lines += ["", "  " + warning]
    lines += ["", "  Press Ctrl-C to stop.", ""]
    return "\n".join(lines)


def loading_message(config: Config) -> str:
    """What `serve` says before loading: the demo checkpoint is said to be created only on the
    start that creates it (it is reused after), and its random weights are always named."""
    from kimiaudio.random_weights.demo_checkpoint import DEMO_DIR_NAME, is_current

    if config.model.path:
        return f"Loading the model from {config.resolve(config.model.path)}..."
    demo = config.data_dir / DEMO_DIR_NAME
    if is_current(demo):
        return f"Loading the demo checkpoint in {demo} (random weights: its speech is noise)..."
    return f"Creating the demo checkpoint in {demo} (random weights: its speech is noise), then loading it..."


def _sessions_answering(context: ServerContext) -> int:
    return sum(1 for s in context.sessions.live() if s.is_answering)


async def _all_answered(context: ServerContext) -> None:
    """Returns once no /v1 answer runs and no session answers, both at once."""
    while True:
        await context.answers.none_running()
        if not _sessions_answering(context):
            return
        await asyncio.sleep(POLL_S)


async def drain(app: web.Application, grace_s: float, cut_short: asyncio.Event) -> None:
    """Refuse new work, wait (at most `grace_s`, or until `cut_short` is set) until no answer is in
    flight, then cut the /v1 answers left."""
    from kimiaudio.server.context import SERVER_CONTEXT

    context = app[SERVER_CONTEXT]
    context.sessions.is_draining = True
    context.ready.clear()
    in_flight = _sessions_answering(context) + len(context.answers)
    if in_flight:
        log.info("stopping: no new work; waiting up to %.0f s for %d answer(s) in flight", grace_s, in_flight)
        waits = [asyncio.ensure_future(_all_answered(context)), asyncio.ensure_future(cut_short.wait())]
        await asyncio.wait(waits, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
    answering = _sessions_answering(context)
    if answering:  # on_shutdown cuts them
        log.info("stopping: %d session answer(s) cut short (what was heard is stored)", answering)
    cut = context.answers.close()
    if cut:
        log.info("stopping: %d /v1 answer(s) cut short (their clients are told: shutting_down)", cut)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ANSWER_CUT_S):
                await context.answers.none_running()


async def serve_until_signalled(
    app: web.Application, config: Config, on_ready, ssl_context: ssl.SSLContext | None = None
) -> None:
    """ssl_context: HTTPS and WSS (server/tls.py); None = plain HTTP."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=HTTP_SHUTDOWN_TIMEOUT_S)
    await runner.setup()  # starts the store and the pipeline
    try:
        await web.TCPSite(runner, config.server.host, config.server.port, ssl_context=ssl_context).start()
    except OSError as exc:
        await runner.cleanup()
        raise _cannot_listen(config, exc) from None
    signals = asyncio.Event()
    second = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, lambda: second.set() if signals.is_set() else signals.set())
    on_ready()
    try:
        await signals.wait()
        print("\nStopping (press Ctrl-C again to stop at once)...", flush=True)
        await drain(app, config.server.shutdown_grace_s, second)
    finally:
        await runner.cleanup()  # closes the listener, every session (on_shutdown), the pipeline, the store
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(number)


def _cannot_listen(config: Config, exc: OSError) -> KimiAudioError:
    hint = "; is another server running? choose another port with --port" if exc.errno == errno.EADDRINUSE else ""
    where = f"{config.server.host}:{config.server.port}"
    return KimiAudioError(f"cannot listen on {where} ({exc.strerror or exc}){hint}")


def check_listen_address(config: Config) -> None:
    """Bind the server's address once and let it go, before the model loads (minutes for the
    7B): a port in use or a host that is no address of this machine is said at once. (The
    listener itself is made once the app has started; another process could take the port
    in between, which that bind then says.)"""
    host, port = config.server.host, config.server.port
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise _cannot_listen(config, exc) from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            if hasattr(socket, "SO_REUSEADDR"):  # as asyncio's listener binds: a port in TIME_WAIT is free
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise _cannot_listen(config, exc) from None


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run_server(config: Config) -> int:
    """Load the model and serve until SIGTERM/SIGINT; returns the exit code."""
    from kimiaudio.store.startup_check import check_database

    # Before the model, and in this order: a package without its page, bad certificate files
    # and an API key no client can send stop the start before anything is written (the SQLite
    # file's directory included); then an address it cannot listen on and a database problem
    # are said at once.
    check_page_files()
    tls = ssl_context(config)
    AccessPolicy.from_config(config)
    check_listen_address(config)
    check_database(config)
    # Until the server's own handlers take over, SIGTERM stops the start as Ctrl-C does, so
    # what is being written (the demo checkpoint, beside its place) is cleaned up.
    signal.signal(signal.SIGTERM, _interrupt)
    print(loading_message(config), flush=True)
    try:
        from kimiaudio.pipeline.model_stack import ModelStack, freeze_loaded_objects
        from kimiaudio.server.app import create_app
        from kimiaudio.server.context import SERVER_CONTEXT

        stack = ModelStack.load(config, progress=True)
    except KeyboardInterrupt:
        print("\nInterrupted while loading the model.")
        return 130
    app = create_app(config, stack)
    freeze_loaded_objects()
    warnings = [
        warning
        for warning in (
            exposure_warning(config, app[SERVER_CONTEXT].access),
            key_warning(app[SERVER_CONTEXT].access),
            validity_warning(config, datetime.now(UTC)),
        )
        if warning
    ]
    for warning in warnings:
        log.warning("%s", warning)
    asyncio.run(serve_until_signalled(app, config, lambda: print(banner(config, stack, warnings), flush=True), tls))
    print("kimiaudio stopped.")
    return 0
