"""The streaming HTTP client: sends one request, timestamps every streamed token as it is read.
Speaks TGI's `/generate_stream` (`data:{"token":…,"generated_text":…}` events, no `[DONE]`)
and OpenAI's `/v1/completions` with `stream: true` (`data: {...}` chunks, then `data: [DONE]`).
Errors on a stream arrive as an event with an `error` field and HTTP status 200."""
import json
import time
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from superinfer.bench.outcomes import Slo
from superinfer.bench.workload import WorkloadRequest

Api = Literal["tgi", "openai"]


@dataclass
class RequestRecord:
    """What the client saw of one request. Times are seconds on the bench's monotonic clock."""

    index: int
    prompt_tokens: int
    max_new_tokens: int
    priority: int = 0
    sent_at: float = 0.0
    token_times: list[float] = field(default_factory=list)
    done_at: float = 0.0
    finish_reason: str | None = None
    error: str | None = None
    # Refused at once with 429 (SLO admission, or the concurrency limit): sent elsewhere by a
    # router in front, so judged apart from the requests the server took.
    refused: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.token_times)


def _payload(api: Api, spec: WorkloadRequest, slo: Slo | None) -> tuple[str, dict]:
    if api == "tgi":
        parameters: dict = {"max_new_tokens": spec.max_new_tokens, "details": True, "do_sample": False}
        if spec.ignore_eos:
            parameters["ignore_eos"] = True
        if slo is not None:
            parameters["slo"] = slo.request_json()
        if spec.priority:
            parameters["priority"] = spec.priority
        return "/generate_stream", {"inputs": spec.prompt, "parameters": parameters}
    body: dict = {
        "model": "tgi",
        "prompt": spec.prompt,
        "max_tokens": spec.max_new_tokens,
        "temperature": 0.0,
        "stream": True,
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if slo is not None:
        body["slo"] = slo.request_json()
    if spec.priority:
        body["priority"] = spec.priority
    return "/v1/completions", body


def _handle_event(api: Api, event: dict, record: RequestRecord, now: float) -> bool:
    """Records one decoded event; True when the stream is finished."""
    if "error" in event:
        error = event["error"]
        record.error = error.get("message", str(error)) if isinstance(error, dict) else str(error)
        # A refusal after a stream started (a queue time-out; from TGI, any refusal) arrives as
        # an error event after a 200: TGI's `error_type` "overloaded", OpenAI's
        # `http_status_code` 429. (SuperInfer answers one before the start with the 429 itself.)
        # Before any token it is the server shedding the request, not a failure.
        overloaded = (event.get("error_type") == "overloaded"
                      or (isinstance(error, dict) and error.get("http_status_code") == 429))
        record.refused = overloaded and not record.token_times
        return True
    if api == "tgi":
        if event.get("token") is not None:
            record.token_times.append(now)
        details = event.get("details")
        if event.get("generated_text") is not None:
            record.finish_reason = details.get("finish_reason") if isinstance(details, dict) else "unknown"
            return True
        return False
    choices = event.get("choices") or []
    if choices:
        # One chunk per generated token; the usage-only chunk at the end has no choices.
        record.token_times.append(now)
        if choices[0].get("finish_reason"):
            record.finish_reason = choices[0]["finish_reason"]
    return False


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    api: Api,
    spec: WorkloadRequest,
    slo: Slo | None,
    clock_origin: float,
) -> RequestRecord:
    """Streams one request to completion; never raises for a server-side failure (it is
    recorded in `record.error`, the request then counts as missing every objective)."""
    if spec.prompt is None:
        raise ValueError(f"request {spec.index} has no prompt text")
    record = RequestRecord(spec.index, spec.prompt_tokens, spec.max_new_tokens, spec.priority)
    route, body = _payload(api, spec, slo)
    record.sent_at = time.perf_counter() - clock_origin
    try:
        async with session.post(base_url.rstrip("/") + route, json=body) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                record.refused = response.status == 429
                record.done_at = time.perf_counter() - clock_origin
                return record
            async for raw in response.content:
                now = time.perf_counter() - clock_origin
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                if _handle_event(api, json.loads(data), record, now):
                    break
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as error:
        record.error = f"{type(error).__name__}: {error}"
    record.done_at = time.perf_counter() - clock_origin
    if record.error is None and not record.token_times:
        record.error = "the stream ended without a token"
    return record
