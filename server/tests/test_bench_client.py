"""The streaming client and the bench command against a small local SSE server that speaks
TGI's `/generate_stream`, OpenAI's `/v1/completions` and `/tokenize` with known timing. (The
real server is exercised by test_bench_e2e.py.)"""
import asyncio
import json
import threading

import aiohttp
import pytest
from aiohttp import web

from superinfer.bench.client import send
from superinfer.bench.outcomes import Slo
from superinfer.bench.runner import Target, reduce, replay
from superinfer.bench.tokenizer import HttpTokenizer
from superinfer.bench.workload import WorkloadRequest
from superinfer.cli import main

FIRST_TOKEN_S = 0.06
GAP_S = 0.02


class SseServer:
    """aiohttp on a loopback port in its own thread; records every JSON body it receives."""

    def __init__(self):
        self.bodies: list[dict] = []
        # When set, /generate_stream answers nothing until this many requests have arrived: a
        # client that waits for one response before sending the next never gets there.
        self.hold_until: int | None = None
        self.all_arrived: asyncio.Event | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _generate_stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.hold_until is not None:
            if self.all_arrived is None:
                self.all_arrived = asyncio.Event()
            if len(self.bodies) >= self.hold_until:
                self.all_arrived.set()
            await asyncio.wait_for(self.all_arrived.wait(), timeout=30)
        count = body["parameters"]["max_new_tokens"]
        if body["inputs"] in ("fail", "refuse"):
            response = web.StreamResponse()
            await response.prepare(request)
            kind = "generation" if body["inputs"] == "fail" else "overloaded"
            await response.write(f'data:{{"error":"boom","error_type":"{kind}"}}\n\n'.encode())
            return response
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(FIRST_TOKEN_S)
        for index in range(1, count + 1):
            last = index == count
            event = {"index": index, "token": {"id": index, "text": " t", "logprob": -0.1, "special": False},
                     "generated_text": " t" * count if last else None,
                     "details": {"finish_reason": "length", "generated_tokens": count} if last else None}
            await response.write(f"data:{json.dumps(event)}\n\n".encode())
            if not last:
                await asyncio.sleep(GAP_S)
        return response

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(FIRST_TOKEN_S)
        for index in range(body["max_tokens"]):
            finish = "length" if index == body["max_tokens"] - 1 else None
            chunk = {"choices": [{"index": 0, "text": " t", "finish_reason": finish}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(GAP_S)
        await response.write(b'data: {"choices": [], "usage": {"completion_tokens": 1}}\n\ndata: [DONE]\n\n')
        return response

    async def _tokenize(self, request: web.Request) -> web.Response:
        text = (await request.json())["inputs"]
        tokens, start = [], None
        for i, char in enumerate(text + " "):
            if char.isspace() and start is not None:
                tokens.append({"id": 0, "text": text[start:i], "start": start, "stop": i})
                start = None
            elif not char.isspace() and start is None:
                start = i
        return web.json_response(tokens)

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response()

    async def _start(self):
        app = web.Application()
        app.router.add_post("/generate_stream", self._generate_stream)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    def __enter__(self):
        self.thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *_exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def server():
    with SseServer() as running:
        yield running


def spec(index: int, tokens: int, arrival: float = 0.0, prompt: str = "hello there") -> WorkloadRequest:
    return WorkloadRequest(index, arrival, 2, tokens, True, prompt)


@pytest.mark.parametrize("api", ["tgi", "openai"])
def test_client_timestamps_every_token(server, api):
    (record,) = replay(Target(server.url, api), [spec(0, 5)], Slo(500, 100), progress=False)
    assert record.ok, record.error
    assert len(record.token_times) == 5 and record.finish_reason == "length"
    assert record.token_times[0] - record.sent_at >= FIRST_TOKEN_S
    # A token can be read late but never before it was sent, so the span is a lower bound.
    assert record.token_times[-1] - record.token_times[0] >= 4 * GAP_S * 0.95
    body = server.bodies[-1]
    if api == "tgi":
        assert body["parameters"]["ignore_eos"] is True and body["parameters"]["slo"] == {"ttft_ms": 500, "tbt_ms": 100}
    else:
        assert body["stream"] is True and body["max_tokens"] == 5


def test_stream_error_event_marks_the_request_failed(server):
    async def one():
        async with aiohttp.ClientSession() as session:
            return await send(session, server.url, "tgi", spec(0, 3, prompt="fail"), None, 0.0)

    record = asyncio.run(one())
    assert not record.ok and record.error == "boom" and not record.refused


def test_an_overloaded_error_event_before_any_token_is_a_refusal(server):
    """`--admission slo` refuses on /generate_stream with an error event after a 200 (TGI's
    way): the bench counts it as refused, not failed, as it counts a 429 on the other routes."""
    async def one():
        async with aiohttp.ClientSession() as session:
            return await send(session, server.url, "tgi", spec(0, 3, prompt="refuse"), None, 0.0)

    record = asyncio.run(one())
    assert record.refused and not record.ok and not record.token_times


def test_open_loop_arrivals_and_attainment(server):
    specs = [spec(i, 4, arrival=0.05 * i) for i in range(6)]
    # The server answers none until all six have arrived: a closed loop would time out.
    server.hold_until = len(specs)
    records = replay(Target(server.url, request_timeout_s=60), specs, None, progress=False)
    assert all(r.ok for r in records), [r.error for r in records]
    # Each was sent at its arrival offset, never before (the clock's resolution aside).
    assert all(r.sent_at >= 0.05 * i - 1e-3 for i, r in enumerate(records))
    generous = reduce(records, Slo(ttft_ms=5000, tbt_ms=1000), "fake", 20.0)
    strict = reduce(records, Slo(ttft_ms=FIRST_TOKEN_S * 1e3 / 2, tbt_ms=1000), "fake", 20.0)
    assert generous.summary["attainment"]["both"] == 1.0
    assert strict.summary["attainment"]["ttft"] == 0.0 and strict.summary["attainment"]["tbt"] == 1.0
    assert generous.summary["output_tokens"] == 24


def test_http_tokenizer_gives_character_spans(server):
    assert HttpTokenizer(server.url).spans("ab  cd e") == [(0, 2), (4, 6), (7, 8)]


def test_bench_command_writes_report_and_plots(server, tmp_path):
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps([{"id": "x", "conversations": [
        {"from": "human", "value": "one two three four five six seven eight nine ten"},
        {"from": "gpt", "value": "a b c d e f"}]}]))
    out = tmp_path / "out"
    code = main(["bench", "--url", server.url, "--rates", "20,40", "--num-requests", "4", "--prompt-tokens", "7",
                 "--output-tokens", "3", "--sharegpt", str(sharegpt), "--out", str(out), "--no-progress",
                 "--calibration-requests", "2", "--ttft-slo-scale", "3"])
    assert code == 0
    document = json.loads((out / "bench.json").read_text())
    assert document["label"] == "measured" and [run["rate"] for run in document["runs"]] == [20.0, 40.0]
    # Relative objectives: 3 × the unloaded TTFT it measured first.
    assert document["slo"]["ttft_ms"] == pytest.approx(3 * document["unloaded"]["ttft_s"] * 1e3)
    assert all(run["summary"]["completed"] == 4 for run in document["runs"])
    prompts = [body["inputs"] for body in server.bodies]
    assert all(len(p.split()) == 7 for p in prompts)
    for name in ("attainment_vs_rate", "p99_ttft_vs_rate", "cdf_ttft", "cdf_tbt"):
        assert (out / f"bench_{name}.png").stat().st_size > 1000
