"""Server events checked strictly against the official `openai` SDK's models, GA or beta.

The SDK itself does not validate what it receives (it builds its models unchecked); a strict
consumer such as openai-agents-python validates every event with a pydantic TypeAdapter over
the RealtimeServerEvent union, discriminated by `type`. `check(event, api)` does the same, so a
missing required field, a value outside a Literal (a content type, a status reason) or an event
type the SDK does not know fails here with pydantic's message.

One documented exception: beta's `transcription_session.updated` model requires
`session.client_secret`, which the model's own docstring says is "not present when a session
is updated via the WebSocket API"; it is checked as if one had been sent.
"""

from __future__ import annotations

import functools
import typing
from typing import Annotated, Any, Union

import pydantic

from kimiaudio.server.session.event_shape import BETA_NAMES


def named(ga_name: str, api: str) -> str:
    """The event's name in the shape `api` ("ga" or "beta"), for tests that run in both shapes
    and name events once, in GA (test_server_event_shapes.py checks the beta names themselves)."""
    return BETA_NAMES.get(ga_name, ga_name) if api == "beta" else ga_name


@functools.cache
def adapter(api: str):
    """A TypeAdapter over the SDK's RealtimeServerEvent union of the shape `api`."""
    if api == "ga":
        from openai.types.realtime import RealtimeServerEvent
    else:
        from openai.types.beta.realtime import RealtimeServerEvent
    members = typing.get_args(typing.get_args(RealtimeServerEvent)[0])
    return pydantic.TypeAdapter(Annotated[Union[members], pydantic.Field(discriminator="type")])  # noqa: UP007


def check(event: dict[str, Any], api: str) -> None:
    """Raises pydantic's ValidationError if the SDK's models of `api` do not hold `event`."""
    if api == "beta" and event.get("type") == "transcription_session.updated":
        event = {**event, "session": {"client_secret": {"value": "", "expires_at": 0}, **event["session"]}}
    adapter(api).validate_python(event)
