"""InputClock: a reader with frames queued more than a second behind real time drops them until
it has caught up; a reader that waits for its frames is never behind, however late their media
time (a sender that fell behind its own clock is not a server overload)."""

from dataclasses import dataclass

from kimiaudio.server.transport.input_clock import MAX_LAG_S, InputClock

FRAME_S = 0.02


@dataclass
class Frame:
    time: float
    samples: int = 960
    sample_rate: int = 48000


def run(clock: InputClock, arrivals: list[tuple[float, float, bool]]) -> list[bool]:
    """(wall time read, media time, waited) per frame -> dropped or not."""
    return [clock.is_behind(Frame(media), waited, now=now) for now, media, waited in arrivals]


def test_frames_in_real_time_are_never_dropped():
    dropped = []
    clock = InputClock("s", dropped.append)
    assert not any(run(clock, [(10 + i * FRAME_S, i * FRAME_S, True) for i in range(500)]))
    assert dropped == []


def test_a_backlog_is_dropped_until_caught_up_and_counted():
    dropped = []
    clock = InputClock("s", dropped.append)
    run(clock, [(10.0, 0.0, True)])
    # The server stalled for 1.5 s: 75 frames are queued and come back at once (not waited for),
    # then the reader drains them 1 ms apart.
    backlog = [(11.5 + i * 0.001, (i + 1) * FRAME_S, False) for i in range(75)]
    result = run(clock, backlog)
    assert result[0] and not result[-1], "dropping starts at once and stops once nearly caught up"
    first_kept = result.index(False)
    lag_then = backlog[first_kept][0] - 10.0 - backlog[first_kept][1]
    assert lag_then <= MAX_LAG_S / 4 + FRAME_S
    assert abs(sum(dropped) - first_kept * FRAME_S) < 1e-9  # seconds of audio dropped, all counted


def test_a_late_sender_is_not_mistaken_for_an_overloaded_server():
    dropped = []
    clock = InputClock("s", dropped.append)
    run(clock, [(10.0, 0.0, True)])
    # The client stalled 1.5 s and then sends in real time again: its frames are 1.5 s late for
    # ever, but the reader waits for each one (nothing is queued), so nothing is dropped.
    late = [(11.5 + i * FRAME_S, (i + 1) * FRAME_S, True) for i in range(500)]
    assert not any(run(clock, late))
    assert dropped == []
