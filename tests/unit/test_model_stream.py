"""How the OpenAI adapter reads a streamed Chat Completions response: the server-sent events as
providers write them, whatever pieces the network cuts them into."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from chamvi_runs.llm_openai import _batches


class Request:
    """What the errors carry: the client's request (they look at its headers only)."""

    headers: dict[str, str] = {}


REQUEST = Request()


class Response:
    def __init__(self, *blocks: bytes, fail: Exception | None = None) -> None:
        self.blocks, self.fail, self.http_request = blocks, fail, REQUEST

    def iter_bytes(self) -> Iterator[bytes]:
        yield from self.blocks
        if self.fail:
            raise self.fail


def stream(*chunks: dict) -> bytes:
    return (
        b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"
    )


def chunks(response: Response) -> list[dict]:
    return [chunk for batch in _batches(response) for chunk in batch]


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[n : n + size] for n in range(0, len(data), size)]


CHUNKS = [
    {"choices": [{"index": 0, "delta": {"content": "Hé, wörld"}}]},
    {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f"}}]}}
        ]
    },
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3}},
]


@pytest.mark.parametrize("size", [1, 2, 7, 10_000])
def test_chunks_cut_anywhere_by_the_network_read_whole(size):
    assert chunks(Response(*pieces(stream(*CHUNKS), size))) == CHUNKS


def test_what_providers_add_around_the_data_is_skipped():
    body = (
        b": keep-alive\r\n\r\n"
        b"event: message\r\nid: 1\r\ndata:" + json.dumps(CHUNKS[0]).encode() + b"\r\n\r\n"
        b"retry: 100\n\n"
        b"data: [DONE]\n\n"
        b"data: " + json.dumps(CHUNKS[1]).encode() + b"\n\n"  # nothing after [DONE] is read
    )
    assert chunks(Response(body)) == [CHUNKS[0]]


def test_a_last_event_without_its_blank_line_still_counts():
    body = b"data: " + json.dumps(CHUNKS[0]).encode()
    assert chunks(Response(body)) == [CHUNKS[0]]


def test_an_event_over_several_data_lines_is_one_chunk():
    body = b'data: {"choices":\ndata: []}\n\n'
    assert chunks(Response(body)) == [{"choices": []}]


def test_a_chunk_with_an_error_is_the_providers_error():
    body = stream(CHUNKS[0]).replace(b"data: [DONE]", b'data: {"error": {"message": "overloaded"}}')
    read = _batches(Response(body))
    assert next(read) == [CHUNKS[0]]  # the chunks before the error or the cut first
    with pytest.raises(openai.APIError, match="overloaded") as raised:
        next(read)
    assert raised.value.body == {"message": "overloaded"} and raised.value.request is REQUEST


def test_a_failed_read_is_a_cut_connection_whatever_the_http_library_raised():
    read = _batches(Response(stream(CHUNKS[0])[:-10], fail=OSError("peer closed connection")))
    assert next(read) == [CHUNKS[0]]  # the chunks before the error or the cut first
    with pytest.raises(openai.APIConnectionError) as raised:
        next(read)
    assert isinstance(raised.value.__cause__, OSError)


def test_the_chunks_of_one_network_read_cross_to_the_execution_together():
    whole = stream(*CHUNKS)
    cut = whole.index(b"\n\n", whole.index(b"\n\n") + 2) + 2  # after the second event
    assert list(_batches(Response(whole[:cut], whole[cut:]))) == [CHUNKS[:2], CHUNKS[2:]]
