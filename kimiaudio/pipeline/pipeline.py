"""The pipeline: a user turn (audio + history) goes in; text deltas and 24 kHz PCM come out.

The one owner of device work (docs/architecture.md, "Layers": server -> pipeline -> engine,
detokenizer, encoders). Two workers, each a thread with its own CUDA stream (see worker.py):
- the LM worker (lm_worker.py): speech encoders, prompts, the continuous-batching engine;
- the detokenizer worker (detok_worker.py): DiT + vocoder, batched across streams.
They meet only through the detokenizer worker's inbox (codes as they are generated), so an
LM step never waits for a detokenizer batch. The asyncio side only posts (submit, cancel) and
reads each turn's TurnHandle; it never waits on a worker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys

from kimiaudio.audio.rates import SPEECH_INPUT_RATE, SPEECH_OUTPUT_RATE
from kimiaudio.engine.llm_engine import LLMEngine
from kimiaudio.engine.request import ANSWER_PRIORITY
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.detok_worker import DetokWorker
from kimiaudio.pipeline.gc_pauses import GcPauses
from kimiaudio.pipeline.lm_worker import LmWorker
from kimiaudio.pipeline.memory_plan import check_plan, kv_blocks_on_device, plan_stack
from kimiaudio.pipeline.memory_report import format_memory_plan
from kimiaudio.pipeline.metrics import PipelineMetrics
from kimiaudio.pipeline.turn_handle import TurnHandle
from kimiaudio.pipeline.turn_request import TurnRequest
from kimiaudio.pipeline.voice_registry import Voice, VoiceRegistry

log = logging.getLogger(__name__)

# The model threads and the event loop share the interpreter: every torch call a thread makes
# hands the GIL over, and taking it back waits up to this long while another thread runs
# Python (CPython's default is 5 ms, a whole LM step). A decode step makes tens of such calls
# on its host side, so the wait scales with this interval: beside one thread running Python,
# ten calls took 7.5 ms at 0.5 ms and 2.7 ms at 0.1 ms (a 2-core CPU), the other thread's pace
# unchanged.
# Process-wide.
GIL_SWITCH_INTERVAL_S = 0.0001
STOP_TIMEOUT_S = 30.0


class Pipeline:
    def __init__(self, stack, config, device_bytes: int | None = None):
        """`device_bytes`: the capacity the memory plan sizes the KV pool from (default: the
        card or this process's cap on CUDA, the CPU budget on the CPU)."""
        detokenizer = stack.detokenizer
        if detokenizer is not None and detokenizer.sample_rate != SPEECH_OUTPUT_RATE:
            raise KimiAudioError(
                f"vocoder/config.json: sampling_rate {detokenizer.sample_rate}; the pipeline "
                f"streams {SPEECH_OUTPUT_RATE} Hz, the official vocoder's rate"
            )
        self.stack = stack
        self.config = config
        self.metrics = PipelineMetrics()
        self.memory = plan_stack(stack, config, device_bytes)
        short = check_plan(self.memory, str(stack.device))
        log.info("%s", format_memory_plan(self.memory))
        if short:
            log.warning(short)
        # Memory is planned with the KV pool last (memory_plan.py): the detokenizer's graphs
        # are captured first (replayed later on its worker's stream), then the pool gets what
        # the plan leaves after every other part, this config's sessions included.
        self.detok_graphs: dict = {}
        if detokenizer is not None:
            detokenizer.graph_capture.on_capture = None  # (an earlier pipeline's, on the same stack)
            self.detok_graphs = detokenizer.prepare_for_serving()
            g = self.detok_graphs
            if g["cuda_graphs"] and not g["new_graphs"]:
                log.info(
                    "detokenizer: its %d DiT and %d vocoder CUDA graphs were captured before (the stack's)",
                    g["dit_graphs"],
                    g["vocoder_graphs"],
                )
            elif g["cuda_graphs"]:
                log.info(
                    "detokenizer: captured %d DiT and %d vocoder CUDA graphs in %.1f s, %.2f GiB (planned %.2f GiB)",
                    g["dit_graphs"],
                    g["vocoder_graphs"],
                    g["seconds"],
                    g["added_bytes"] / 2**30,
                    self.memory["reserved"].get("detok_graph_pool", 0) / 2**30,
                )
            # Shapes captured from here on were not planned: met while serving (the bench counts them).
            detokenizer.graph_capture.on_capture = self.metrics.note_graph_capture
        num_blocks = kv_blocks_on_device(self.memory, stack.device)
        self.engine = LLMEngine(stack.lm, config.engine, stack.device, stack.dtype, num_blocks=num_blocks)
        if self.engine.runner.graphs is not None:
            log.info(
                "LM graphs (decode and mixed steps): %.2f GiB (planned %.2f GiB); KV pool %d blocks",
                self.engine.runner.graph_memory_bytes / 2**30,
                sum(self.memory["reserved"].get(part, 0) for part in ("lm_graph_pool", "lm_mixed_graph_pool")) / 2**30,
                num_blocks,
            )
        self._detok = None
        if detokenizer is not None:
            self._detok = DetokWorker(
                detokenizer,
                config,
                stack.device,
                self.metrics,
                llm_busy=lambda: self._lm.busy,
                on_failed=lambda turn_id: self._lm.drop(turn_id),
            )
        self._lm = LmWorker(stack, config, self.engine, self._detok, self.metrics)
        self._ids = itertools.count()
        self._gc = GcPauses(self.metrics)  # collections while serving, timed into the metrics
        self._running = False
        self.voices = VoiceRegistry(
            config.voices.default, config.server.openai_voice
        )  # names -> voices; the server fills it

    # ---- what callers may know -------------------------------------------------------------
    @property
    def can_speak(self) -> bool:
        """False for a text-only stack: every turn is answered in text."""
        return self._detok is not None

    @property
    def samples_per_code(self) -> int | None:
        """24 kHz samples per speech code (None without a detokenizer): cuts heard audio to codes."""
        return self.stack.detokenizer.samples_per_token if self.can_speak else None

    @property
    def speech_positions_per_second(self) -> float:
        """Prompt positions a second of user speech takes: one per Whisper token (as many as its
        speech codes), the checkpoint's samples per token at 16 kHz."""
        return SPEECH_INPUT_RATE / self.stack.whisper.samples_per_token

    @property
    def workers_alive(self) -> bool:
        """Both workers run (False once either loop broke: turns are refused, /readyz says so)."""
        return self._lm.is_alive and (self._detok is None or self._detok.is_alive)

    # ---- lifetime ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start both workers; raises KimiAudioError if either cannot run (e.g. its device
        fails as the thread takes it up), with both stopped again."""
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        workers = [w for w in (self._detok, self._lm) if w is not None]
        for worker in workers:
            worker.start()
        for worker in workers:
            try:
                await asyncio.wrap_future(worker.started)
            except Exception as exc:
                loop = asyncio.get_running_loop()
                for other in workers:
                    await loop.run_in_executor(None, other.stop, STOP_TIMEOUT_S)
                raise KimiAudioError(f"the {worker.name} worker could not start ({type(exc).__name__}: {exc})") from exc
        self._gc.install()
        self._running = True

    async def stop(self) -> None:
        """End every turn in flight (failed, "server shutting down"), stop both workers and give
        the KV pool's memory back."""
        if not self._running:
            return
        self._running = False
        self._gc.remove()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._lm.stop, STOP_TIMEOUT_S)  # its turns' ends reach the detok worker
        if self._detok is not None:
            await loop.run_in_executor(None, self._detok.stop, STOP_TIMEOUT_S)
        if not self._lm.is_alive:  # its loop has ended: no step uses the pool again
            self.engine.release()  # a pipeline built next in this process plans without it

    # ---- turns -----------------------------------------------------------------------------
    def submit(self, request: TurnRequest) -> TurnHandle:
        """Queue a turn (from the event loop); iterate the handle for its events."""
        if not self._running:
            raise KimiAudioError("the pipeline is not running")
        if not self.workers_alive:
            raise KimiAudioError("the model workers stopped (see the server log); restart the server")
        handle = TurnHandle(f"turn-{next(self._ids)}", asyncio.get_running_loop())
        handle.background = request.priority != ANSWER_PRIORITY
        self._lm.submit(handle, request)
        return handle

    # ---- voices --------------------------------------------------------------------------------
    async def make_voice(self, name: str, pcm16k, pcm24k, created_at: float = 0.0) -> Voice:
        """A voice from a reference recording: its codes (the GLM-4 tokenizer, on the LM worker)
        and its DiT prefix (on the detokenizer worker, kept on the device). Raises
        KimiAudioError when the reference cannot be a voice for this checkpoint."""
        detok = self._speaking_worker("voices")
        codes = await asyncio.wrap_future(self._lm.voice_codes(pcm16k))
        voice = Voice.create(name, pcm24k, codes, created_at)
        await asyncio.wrap_future(detok.prepare_voice(voice))
        return voice

    async def prepare_voice(self, voice: Voice) -> None:
        """Make sure the voice's prefix is on the device (e.g. the stored voices at start-up)."""
        detok = self._speaking_worker("voices")
        await asyncio.wrap_future(detok.prepare_voice(voice))

    def forget_voice(self, voice: Voice) -> None:
        """A deleted voice: its prefix leaves the device (turns speaking in it finish)."""
        if self._running and self._detok is not None:
            self._detok.forget_voice(voice.key)

    def _speaking_worker(self, what: str) -> DetokWorker:
        """The detokenizer worker, for `what` needs speech; KimiAudioError if there is none."""
        if not self.can_speak or self._detok is None:
            raise KimiAudioError(f"{what}: this server answers in text only (model.text_only = true)")
        if not self._running:
            raise KimiAudioError("the pipeline is not running")
        return self._detok

    def cancel(self, handle: TurnHandle) -> None:
        """Stop a turn now: its KV blocks and detokenizer state are dropped on the workers, and
        its TurnDone (status cancelled) follows."""
        if self._running and handle.done is None:
            self._lm.cancel(handle.turn_id)

    def stats(self) -> dict:
        s = self.engine.stats()  # plain counters: a read racing a step may be one step old
        m = self.metrics
        return {
            "kv_blocks_total": s.num_blocks_total,
            "kv_blocks_free": s.num_blocks_free,
            "running": s.num_running,
            "waiting": s.num_waiting,
            "turns": self._lm.num_turns + (self._detok.num_turns if self._detok else 0),
            "prefill_tokens_computed": s.num_prefill_tokens_computed,
            "prefill_tokens_cached": s.num_prefill_tokens_cached,
            "decode_tokens": s.num_decode_tokens,
            "preemptions": s.num_preemptions,
            "steps": s.num_steps,
            "max_batch_sizes": {stage: m.max_batch[stage] for stage in ("encode", "llm", "detok")},
            "turns_by_status": dict(m.turns),
            **self._voice_stats(),
        }

    def _voice_stats(self) -> dict:
        if self._detok is None:
            return {}
        bank = self._detok.voices
        return {
            "voice_prefixes_built": bank.num_built,
            "voice_prefixes_cached": bank.num_cached,
            "voice_prefixes_evicted": bank.num_evicted,
            "voice_prefill_calls": self.stack.detokenizer.num_prefill_calls,
        }
