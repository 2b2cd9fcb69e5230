"""What the server counts, and the registry `/metrics` exposes (one per app, no globals).

The registry holds the server's own metrics (below) and the PipelineCollector (the pipeline's
timings, counters and KV pool, read at scrape time). Transports report what their sessions
send through `observe_event` (response.done: status and commit -> first packet sent; error:
its code) and WebRTC's playback gaps through `note_underrun` (a WebSocket client buffers and
plays the audio itself: the server cannot hear it run dry). Every spoken answer's audio is
counted once by `note_audio`, where it leaves the server's hands: a session's Responder, as it
pushes the audio to its playback (whichever transport), or a chat completion
(v1/chat_stream.py `note_audio_out`, streamed or not). The error middleware reports HTTP errors,
and v1/openai_output.py the `error` events that end a /v1 stream (a client that hung up is no
error: request_log.py's CLIENT_CLOSED is not counted).

Every sample of `/metrics` carries an `instance` label, so a Prometheus scraping every
instance of a fleet tells them apart (docs/deploy.md). The registry itself stays unlabelled
(code that reads a sample back, e.g. the soak's books, names it as before); the label is added
when the exposition is written (`InstanceLabelled`). Its value is `[server] instance_id`, or by
default `hostname:port` (a pod's name on Kubernetes).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from kimiaudio.pipeline.metrics import LATENCY_BUCKETS
from kimiaudio.pipeline.pipeline import Pipeline
from kimiaudio.server.observe.pipeline_collector import PipelineCollector
from kimiaudio.server.observe.request_log import CLIENT_CLOSED

INSTANCE_LABEL = "instance"


def instance_id(configured: str, port: int) -> str:
    """`configured` (the setting), or this machine's name and the port served."""
    return configured or f"{socket.gethostname()}:{port}"


class InstanceLabelled:
    """A collector that yields `registry`'s metric families with the instance label added."""

    def __init__(self, registry: CollectorRegistry, instance: str):
        self._registry = registry
        self.instance = instance

    def collect(self):
        for family in self._registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                sample._replace(labels={**sample.labels, INSTANCE_LABEL: self.instance}) for sample in family.samples
            ]
            yield labelled

    def exposition(self) -> bytes:
        """The Prometheus text format of every sample, labelled."""
        return generate_latest(self)


class ServerMetrics:
    def __init__(self, pipeline: Callable[[], Pipeline | None], active_sessions: Callable[[], int], instance: str):
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.exposed = InstanceLabelled(registry, instance)  # what /metrics writes
        self.sessions = Counter("kimiaudio_sessions", "Sessions admitted", ["transport"], registry=registry)
        Gauge("kimiaudio_sessions_active", "Session slots in use", registry=registry).set_function(active_sessions)
        self.responses = Counter(
            "kimiaudio_responses", "Responses ended, by the status sent to the client", ["status"], registry=registry
        )
        self.responses_open = Gauge(
            "kimiaudio_responses_in_progress", "Responses created and not yet ended", registry=registry
        )
        self.errors = Counter(
            "kimiaudio_errors", "Errors reported to clients, by where and what", ["source", "kind"], registry=registry
        )
        self.first_packet = Histogram(
            "kimiaudio_commit_to_first_packet_seconds",
            "VAD commit of a user turn -> first audio frame of its answer sent",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.audio = Counter(
            "kimiaudio_audio_generated_seconds",
            "Seconds of answer audio generated (WebRTC, Realtime WebSocket and chat completions)",
            registry=registry,
        )
        self.underruns = Counter(
            "kimiaudio_playback_underruns",
            "WebRTC answers that ran out of audio while playing (once per gap)",
            registry=registry,
        )
        self.input_dropped = Counter(
            "kimiaudio_input_audio_dropped_seconds",
            "Microphone audio dropped because the server was too far behind it (overload)",
            registry=registry,
        )
        registry.register(PipelineCollector(pipeline))

    def observe_event(self, event: dict) -> None:
        """A server event a session sent to its client."""
        kind = event.get("type")
        if kind == "response.created":
            self.responses_open.inc()
        elif kind == "response.done":
            response = event["response"]
            self.responses_open.dec()
            self.responses.labels(response["status"]).inc()
            first = response.get("timings", {}).get("commit_to_first_audio_s")
            if first is not None:
                self.first_packet.observe(first)
        elif kind == "error":
            self.errors.labels("event", event["error"]["code"]).inc()

    def note_error(self, source: str, code: str | None) -> None:
        """An error answered: `source` "http" (an error status) or "stream" (an `error` event ending
        a /v1 stream whose 200 was sent); a client's hang-up is none (nobody was answered)."""
        if code != CLIENT_CLOSED:
            self.errors.labels(source, str(code)).inc()

    def note_audio(self, seconds: float) -> None:
        self.audio.inc(seconds)

    def note_underrun(self) -> None:
        self.underruns.inc()

    def note_input_dropped(self, seconds: float) -> None:
        self.input_dropped.inc(seconds)
