"""The interpreter's garbage collections timed into the pipeline's metrics, and the LM step
records that say which steps a collection (or a detokenizer graph capture) ran in."""

from __future__ import annotations

import gc
from types import SimpleNamespace

from kimiaudio.pipeline.gc_pauses import GcPauses
from kimiaudio.pipeline.metrics import PipelineMetrics
from kimiaudio.pipeline.step_record import StepRecorder


def _stats():
    return SimpleNamespace(num_decode_tokens=0, num_prefill_tokens_computed=0, read_wait_s=0.0)


def test_collections_are_timed_while_installed():
    metrics = PipelineMetrics()
    pauses = GcPauses(metrics)
    enabled = gc.isenabled()
    gc.disable()  # only the collections below
    try:
        pauses.install()
        pauses.install()  # once, however often
        gc.collect()  # a full one
        gc.collect(0)
        pauses.remove()
        gc.collect()  # not timed any more
    finally:
        pauses.remove()
        if enabled:
            gc.enable()
    assert metrics.gc_pause_s.count == 2 and metrics.gc_full_pauses == 1
    assert metrics.gc_paused_s == sum(metrics.gc_pause_s.recent_values()) > 0


def test_a_step_is_tagged_with_the_collections_and_captures_during_it():
    metrics = PipelineMetrics()
    pauses = GcPauses(metrics)
    recorder = StepRecorder()
    enabled = gc.isenabled()
    gc.disable()
    pauses.install()
    try:
        recorder.begin(_stats(), metrics.beside(), 0, False)
        quiet = recorder.end(0.01, _stats(), metrics.beside(), 0.01)
        recorder.begin(_stats(), metrics.beside(), 0, False)
        gc.collect()
        collected = recorder.end(0.01, _stats(), metrics.beside(), 0.01)
        recorder.begin(_stats(), metrics.beside(), 0, False)
        metrics.note_graph_capture()  # the detokenizer begins a capture (Pipeline wires it so)
        captured = recorder.end(0.01, _stats(), metrics.beside(), 0.01)
    finally:
        pauses.remove()
        if enabled:
            gc.enable()
    assert quiet.gc_s == 0 and "gc" not in quiet.tags and not quiet.graph_capture
    assert collected.gc_s == metrics.gc_paused_s > 0 and "gc" in collected.tags
    assert captured.graph_capture and captured.tags == ["capture"] and metrics.detok_graph_captures == 1


def test_a_collection_inside_a_readers_locked_section_is_timed_without_waiting_for_itself():
    """Any allocation may start a collection, also one inside a Timing's locked section (a
    scrape's snapshot): its callback observes in that same thread, so the lock must let it in."""
    metrics = PipelineMetrics()
    pauses = GcPauses(metrics)
    enabled = gc.isenabled()
    gc.disable()
    pauses.install()
    try:
        with metrics.gc_pause_s._lock:  # a reader in this thread, mid-snapshot
            gc.collect()
    finally:
        pauses.remove()
        if enabled:
            gc.enable()
    assert metrics.gc_pause_s.count == 1
