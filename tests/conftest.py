"""Shared fixtures: the official goldens, a demo checkpoint, and real speech made by espeak-ng
(or, where espeak-ng is missing, as on the GPU machine, the same sentence committed as
data/speech_hello_16k.wav)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from kimiaudio.layers.cuda_allocator_settings import prefer_expandable_segments

from helpers.golden_data import GOLDEN_DIRS, GOLDEN_FILES

# Without a GPU the Triton kernels' tests run them in Triton's interpreter (the product's CPU
# path stays torch's: layers/triton_support.py). Triton decides interpreted or compiled when a
# kernel is defined, i.e. when its module is first imported, so this is set here, before any
# test module imports the kernels: with xdist one worker imports many test modules, and one
# that imports the engine first would otherwise define them compiled.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The GPU tests measure memory under the allocator settings `serve` and `bench` run with.
prefer_expandable_segments()

# Under pytest-xdist, the workers share the cores: torch threads (and those of the processes the
# tests start) are divided among them, not every worker running one per core against the others.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# "Hello there, how are you doing today?" by espeak-ng -s 150, resampled to 16 kHz mono PCM16
# with sox: what speech_wav says where espeak-ng cannot be run.
SPEECH_FIXTURE = Path(__file__).parent / "data" / "speech_hello_16k.wav"
# CI installs triton (its CPU wheel) so that every tests/test_triton_*.py runs in Triton's
# interpreter; there a skipped Triton test is a failure, not a pass (.ci/run sets this).
REQUIRE_TRITON = os.environ.get("KIMIAUDIO_REQUIRE_TRITON") == "1"
_triton_skips: list[str] = []


def _note_triton_skip(report) -> None:
    if REQUIRE_TRITON and report.skipped and "test_triton_" in report.nodeid:
        _triton_skips.append(f"{report.nodeid}: {report.longrepr}")


def pytest_collectreport(report):  # a module that skips as it is imported (no triton)
    _note_triton_skip(report)


def pytest_runtest_logreport(report):  # with xdist, the workers' reports arrive here too
    _note_triton_skip(report)


def pytest_sessionfinish(session, exitstatus):
    if _triton_skips and not hasattr(session.config, "workerinput"):  # the controller decides
        print("\nKIMIAUDIO_REQUIRE_TRITON=1 but Triton tests were skipped:\n  " + "\n  ".join(_triton_skips))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config):
    # README's command runs the files on four workers (--dist loadfile) in the order that
    # pytest_collection_modifyitems below gives, not in xdist's (the files with most tests first).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Files with `slow` tests first, then the others, most tests first; each file's tests stay
    together in their order. With --dist loadfile a worker runs one file at a time, and takes
    the next when its file is nearly done: the long files (few tests, each starting processes
    or servers) start early and the short ones fill the end, instead of one worker still
    running a long file after the other ran out of files."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def order(tests: list) -> tuple[bool, int]:
        return (not any(test.get_closest_marker("slow") for test in tests), -len(tests))

    items[:] = [item for tests in sorted(files.values(), key=order) for item in tests]


@pytest.fixture(scope="session", params=GOLDEN_DIRS, ids=[p.name for p in GOLDEN_DIRS])
def golden_dir(request) -> Path:
    return request.param


@pytest.fixture(scope="session")
def golden(golden_dir) -> dict[str, torch.Tensor]:
    import lzma

    from safetensors.torch import load, load_file

    plain = golden_dir / GOLDEN_FILES[0]
    if plain.is_file():
        return load_file(str(plain))
    return load(lzma.decompress((golden_dir / GOLDEN_FILES[1]).read_bytes()))


@pytest.fixture(scope="session")
def golden_meta(golden_dir) -> dict:
    """golden.meta.json: special token ids, prompt layouts, steps run, detokenizer constants."""
    return json.loads((golden_dir / "golden.meta.json").read_text())


@pytest.fixture(scope="session")
def golden_rules(golden_meta):
    """The generation rules' token ids, from golden.meta.json (never from constants)."""
    from kimiaudio.engine.stop_rules import RuleTokens

    ids = golden_meta["special_tokens"]
    return RuleTokens(ids["kimia_text_blank"], ids["kimia_text_eos"], ids["msg_end"], ids["media_end"])


@pytest.fixture(scope="session")
def golden_checkpoint(golden_dir) -> Path:
    return golden_dir / "checkpoint"


@pytest.fixture(scope="module")
def tiny_engine_setup(golden_checkpoint, golden, golden_rules):
    """The golden checkpoint's tiny LM, its goldens and its generation rules (the engine tests')."""
    from helpers.engine_scenarios import load_tiny_lm

    return load_tiny_lm(golden_checkpoint), golden, golden_rules


@pytest.fixture(scope="session")
def golden_paths(golden_checkpoint):
    """The golden checkpoint found as `serve` finds a real one."""
    from kimiaudio.checkpoint.paths import find_checkpoint

    return find_checkpoint(golden_checkpoint)


@pytest.fixture(scope="session")
def detok(golden_paths, golden_meta):
    """The golden checkpoint's detokenizer with the official chunking, look-ahead and ODE
    steps, as golden.meta.json records them (tests share it read-only)."""
    from kimiaudio.detok.detokenizer import Detokenizer

    from helpers.detok_reference import official_detok_config

    return Detokenizer.load(golden_paths, "cpu", torch.float32, official_detok_config(golden_meta))


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory) -> Path:
    """The embedded demo checkpoint, written once per test session (as `serve` does)."""
    from kimiaudio.random_weights.demo_checkpoint import ensure_demo_checkpoint

    return ensure_demo_checkpoint(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory) -> Path:
    """About 2 s of English speech at 22.05 kHz (espeak's own rate: loaders must resample);
    without espeak-ng the committed 16 kHz recording of the same sentence."""
    if shutil.which("espeak-ng") is None:
        return SPEECH_FIXTURE
    path = tmp_path_factory.mktemp("speech") / "hello.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "Hello there, how are you doing today?"], check=True)
    return path


@pytest.fixture(scope="session")
def speech_16k(speech_wav) -> np.ndarray:
    from kimiaudio.audio.io import load_audio

    return load_audio(speech_wav)


@pytest.fixture(scope="session")
def speech(tmp_path_factory):
    """The server tests' sentences spoken by espeak-ng, float32 16 kHz, as bench --webrtc makes
    its speech (helpers.audio.SENTENCES)."""
    from kimiaudio.bench.speech import espeak_speech

    from helpers.audio import SENTENCES

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is needed to make test speech")
    return espeak_speech(SENTENCES, tmp_path_factory.mktemp("sentences"))


@pytest.fixture
def demo_server(aiohttp_client, demo_checkpoint, tmp_path):
    """Opens the server app with the real pipeline on the demo checkpoint (helpers/demo_server.py):
    `async with demo_server(**server_settings) as (test client, RecordingPipeline)`, stopped when
    the block ends. Its SQLite file is under `data_dir` (the test's tmp_path unless given), or
    `storage_url` names a PostgreSQL database; a test may open several, one after another or
    at once."""
    from helpers.demo_server import open_demo_server

    def open_server(data_dir: Path | None = None, storage_url: str = "", **server):
        return open_demo_server(aiohttp_client, demo_checkpoint, data_dir or tmp_path, storage_url, **server)

    return open_server


@pytest.fixture(scope="session")
def v1_serve(tmp_path_factory):
    """A real `python -m kimiaudio serve` on the demo checkpoint for the /v1 tests: its process
    (its log in `proc.output_lines`) and base URL (http://127.0.0.1:PORT); one process shared
    by every test that asks for it."""
    from helpers.serve_process import SERVE_CONFIG, free_port, start_serve, stop_serve

    port = free_port()
    proc = start_serve(tmp_path_factory.mktemp("v1-serve"), port, SERVE_CONFIG)
    yield proc, f"http://127.0.0.1:{port}"
    stop_serve(proc)


@pytest.fixture(scope="session")
def v1_server(v1_serve):
    """v1_serve's base URL."""
    return v1_serve[1]


@pytest.fixture
async def openai_client(v1_server):
    """The official `openai` async client for v1_server (HTTP and the Realtime WebSocket),
    closed at the test's end: left to the garbage collector, its connection pool would be
    closed on an event loop already gone, an ERROR in whichever test runs then."""
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(
        base_url=v1_server + "/v1",
        api_key="unused",
        max_retries=0,
        websocket_base_url=v1_server.replace("http", "ws", 1) + "/v1",
    )
    yield client
    await client.close()


@pytest.fixture(scope="session")
def espeak_voice(tmp_path_factory) -> Path:
    """About 3 s of espeak-ng speech to make a voice of (its own 22.05 kHz: the server resamples)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is needed to make a test voice")
    path = tmp_path_factory.mktemp("voice") / "voice.wav"
    subprocess.run(
        ["espeak-ng", "-w", str(path), "This is the voice I would like you to answer in, please."], check=True
    )
    return path


# CI installs Debian's postgresql (.ci/run sets this): there the PostgreSQL tests must run, never skip.
REQUIRE_POSTGRES = os.environ.get("KIMIAUDIO_REQUIRE_POSTGRES") == "1"


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server of the tests' own (tests/helpers/postgres_server.py), shared by the session;
    tests get their own databases from it (`postgres_url`)."""
    from helpers.postgres_server import PostgresServer, PostgresUnavailable

    try:
        server = PostgresServer()
    except PostgresUnavailable as exc:
        if REQUIRE_POSTGRES:
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    with server:
        yield server


@pytest.fixture(scope="session")
def haproxy_front():
    """Makes an HaproxyFront (tests/helpers/haproxy_front.py, not started) before the given
    instance addresses; skips where haproxy is not installed, as the PostgreSQL fixture does
    (CI installs both and must run these tests)."""
    from helpers.haproxy_front import HaproxyFront, HaproxyUnavailable

    def make(instances: list[str]) -> HaproxyFront:
        try:
            return HaproxyFront(instances)
        except HaproxyUnavailable as exc:
            if REQUIRE_POSTGRES:
                pytest.fail(str(exc))
            pytest.skip(str(exc))

    return make


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The URL of a new empty database on the tests' PostgreSQL server."""
    if not postgres_server.running:  # a test that stopped it failed before starting it again
        postgres_server.start()
    return postgres_server.create_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request, tmp_path):
    """Where a store test's database is, for each backend: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "k.db"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
async def store(store_location):
    """An open ConversationStore at store_location (each backend in turn)."""
    from kimiaudio.store import ConversationStore

    s = ConversationStore(store_location)
    await s.open()
    yield s
    await s.close()
