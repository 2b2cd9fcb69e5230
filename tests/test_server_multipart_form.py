"""The one multipart reader (inputs/multipart_form.py): limits and errors as both form routes
(POST /api/voices, POST /v1/audio/transcriptions) answer them."""

import aiohttp
from aiohttp import web

from kimiaudio.server.inputs.multipart_form import read_form

LIMITS = {"name": 8, "file": 64}


async def echo(request: web.Request) -> web.Response:
    fields = await read_form(request, LIMITS, ("name", "file"), "`name` and `file`")
    return web.json_response({k: [f.text(), f.filename] for k, f in fields.items()})


def form(*parts) -> aiohttp.FormData:
    data = aiohttp.FormData(default_to_multipart=True)
    for name, value, *filename in parts:
        data.add_field(name, value, filename=filename[0] if filename else None)
    return data


async def client(aiohttp_client):
    app = web.Application()
    app.router.add_post("/", echo)
    return await aiohttp_client(app)


async def error(resp, status: int) -> dict:
    assert resp.status == status, await resp.text()
    return (await resp.json())["error"]


async def test_fields_within_limits_first_value_kept_others_skipped(aiohttp_client):
    http = await client(aiohttp_client)
    resp = await http.post(
        "/", data=form(("name", "a"), ("name", "b"), ("other", "x" * 1000), ("file", b"abc", "f.wav"))
    )
    assert resp.status == 200 and await resp.json() == {"name": ["a", None], "file": ["abc", "f.wav"]}


async def test_each_fault_is_its_error(aiohttp_client):
    http = await client(aiohttp_client)
    wrong_type = await error(await http.post("/", json={"name": "a"}), 415)
    assert wrong_type["code"] == "unsupported_media_type" and "application/json" in wrong_type["message"]
    broken = await error(
        await http.post("/", data=b"--x\r\nnot a part", headers={"Content-Type": "multipart/form-data; boundary=y"}),
        400,
    )
    assert broken["code"] == "invalid_multipart"
    # No line break in the first 512 KiB: aiohttp's reader gives up with its own exception type.
    endless = await error(
        await http.post("/", data=b"x" * (600 * 1024), headers={"Content-Type": "multipart/form-data; boundary=y"}), 400
    )
    assert endless["code"] == "invalid_multipart"
    large = await error(await http.post("/", data=form(("name", "a"), ("file", b"x" * 65, "f"))), 413)
    assert large["code"] == "too_large" and "`file`" in large["message"] and "64 bytes" in large["message"]
    missing = await error(await http.post("/", data=form(("name", "a"))), 400)
    assert (missing["code"], missing["param"]) == ("missing_required_parameter", "file")
    empty = await error(await http.post("/", data=form(("name", "a"), ("file", b"", "f"))), 400)
    assert (empty["code"], empty["param"]) == ("invalid_value", "file") and "`file` is empty" in empty["message"]
    not_text = await error(await http.post("/", data=form(("name", b"\xff\xfe", "n"), ("file", b"x", "f"))), 400)
    assert (not_text["code"], not_text["param"]) == ("invalid_value", "name")
