"""/metrics through a real Prometheus server (Debian's `prometheus`; `make prometheus` installs
it): Prometheus scrapes the router every second, and its HTTP API answers the queries the
dashboards make (docs/grafana/superinfer.json, TGI's published dashboard) with sane values —
time to first token and inter-token latency from the histograms, TGI's request counters, the KV
pools, and histograms whose buckets come from the server's limits (docs/metrics.md)."""
import json
import math
import shutil
import subprocess
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import REPO, free_port, launch
from faults import Stream, wait_for

DEVICE_BLOCKS = 256
HOST_BLOCKS = 128
# An odd token limit, above the 1,024 the token histograms used to stop at: their last bucket
# must be this limit.
MAX_TOTAL_TOKENS = 3000
TTFT_SLO_MS = 1500
TBT_SLO_MS = 150
STEP_TIMEOUT_S = 60
FLAGS = ["--device-kv-blocks", str(DEVICE_BLOCKS), "--host-kv-blocks", str(HOST_BLOCKS),
         "--max-batch-tokens", "1024", "--max-total-tokens", str(MAX_TOTAL_TOKENS),
         "--ttft-slo-ms", str(TTFT_SLO_MS), "--tbt-slo-ms", str(TBT_SLO_MS),
         "--step-timeout-s", str(STEP_TIMEOUT_S)]
# The label Kubernetes' service discovery adds, which TGI's dashboard filters on.
CONTAINER = "superinfer"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle:"
GENERATED = 6
STREAM_TOKENS = 8

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="no prometheus on PATH (make prometheus installs it)")


class Prometheus:
    """A Prometheus server on loopback that scrapes one target every second."""

    def __init__(self, directory, target: str):
        config = directory / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: superinfer\n"
            "    static_configs:\n"
            f"      - targets: ['{target}']\n"
            f"        labels: {{container: {CONTAINER}}}\n")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log_path = directory / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}"],
                stdout=log, stderr=subprocess.STDOUT)

    def query(self, expression: str) -> list[dict]:
        """The result vector of an instant query."""
        address = f"{self.url}/api/v1/query?query={urllib.parse.quote(expression)}"
        body = requests.get(address, timeout=10).json()
        if body.get("status") != "success":
            raise RuntimeError(f"{expression}: {body}")
        return body["data"]["result"]

    def value(self, expression: str) -> float | None:
        """The single value of an instant query; None when it has no result."""
        result = self.query(expression)
        if len(result) > 1:
            raise RuntimeError(f"{expression} has {len(result)} series: {result}")
        return float(result[0]["value"][1]) if result else None

    def ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with launch(tmp_path_factory.mktemp("prometheus-server"), FLAGS) as instance:
        yield instance


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    instance = Prometheus(tmp_path_factory.mktemp("prometheus"), server.url.removeprefix("http://"))
    try:
        assert wait_for(instance.ready, timeout_s=60), instance.log_tail()
        # The router is a healthy target before any request is sent, so rates have a start.
        assert wait_for(lambda: instance.value('up{job="superinfer"}') == 1.0, timeout_s=30), instance.log_tail()
        yield instance
    finally:
        instance.stop()


def generate(url: str) -> None:
    parameters = {"max_new_tokens": GENERATED, "ignore_eos": True}
    response = requests.post(f"{url}/generate", json={"inputs": PROMPT, "parameters": parameters}, timeout=300)
    response.raise_for_status()


@pytest.fixture(scope="module")
def traffic(server, prometheus) -> int:
    """Sends requests (one invalid, some concurrent, one streamed) and waits until Prometheus
    has scraped their outcome; returns how many succeeded."""
    # First, so that the failure's series (new with it) has samples enough for a rate.
    invalid = requests.post(f"{server.url}/generate", json={"inputs": PROMPT, "parameters": {"temperature": -1}},
                            timeout=60)
    assert invalid.status_code == 422, invalid.text
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda _: generate(server.url), range(4)))
    generate(server.url)
    stream = Stream(server.url, {"inputs": PROMPT,
                                 "parameters": {"max_new_tokens": STREAM_TOKENS, "ignore_eos": True}}).start()
    assert stream.join(300) and stream.final is not None, (stream.failure, stream.error)
    succeeded = 6
    assert wait_for(lambda: prometheus.value("tgi_request_success") == succeeded, timeout_s=30), \
        (prometheus.value("tgi_request_success"), server.log_tail())
    assert wait_for(lambda: prometheus.value('tgi_request_failure{err="validation"}') == 1.0, timeout_s=30)
    return succeeded


def quantile(prometheus: Prometheus, q: float, histogram: str) -> float:
    """A quantile over every observation so far (the cumulative buckets, summed over every other
    label). Not over rate(): a series born with its final counts in one scrape has no increase
    to rate, and the quantile would be NaN for want of a second sample, not of a value."""
    value = prometheus.value(f"histogram_quantile({q}, sum by (le) ({histogram}_bucket))")
    assert value is not None and math.isfinite(value), (histogram, q, value)
    return value


def test_time_to_first_token_and_inter_token_latency_quantiles_are_sane(prometheus, traffic):
    ttft_p50 = quantile(prometheus, 0.5, "superinfer_time_to_first_token_seconds")
    ttft_p90 = quantile(prometheus, 0.9, "superinfer_time_to_first_token_seconds")
    # Below the last finite bucket (a quantile in +Inf reads as that bound).
    assert 0 < ttft_p50 <= ttft_p90 < 3 * STEP_TIMEOUT_S
    # Each request's first token came before its end (both measured from its arrival).
    mean = "{0}_sum / {0}_count"
    mean_ttft = prometheus.value(mean.format("superinfer_time_to_first_token_seconds"))
    mean_duration = prometheus.value(mean.format("superinfer_request_duration"))
    assert 0 < mean_ttft <= mean_duration, (mean_ttft, mean_duration)
    itl_p50 = quantile(prometheus, 0.5, "superinfer_inter_token_latency_seconds")
    assert 0 < itl_p50 < STEP_TIMEOUT_S
    # Every request contributes one first token, and a gap per further token.
    assert prometheus.value("superinfer_time_to_first_token_seconds_count") == traffic
    gaps = 5 * (GENERATED - 1) + (STREAM_TOKENS - 1)
    assert prometheus.value("superinfer_inter_token_latency_seconds_count") == gaps
    # Every finished request has a verdict on each objective (both counters exist from start-up).
    for objective in ("ttft", "tbt"):
        verdicts = prometheus.value(f"superinfer_slo_{objective}_met_total + superinfer_slo_{objective}_missed_total")
        assert verdicts == traffic, objective


def test_latency_buckets_follow_the_objectives_and_the_step_deadline(prometheus, traffic):
    def bounds(histogram: str) -> list[float]:
        result = prometheus.query(f"{histogram}_bucket")
        return sorted(float(series["metric"]["le"]) for series in result)

    ttft = bounds("superinfer_time_to_first_token_seconds")
    # Fine around the objective, and up to the longest prompt's prefill (3 chunks of 1,024
    # tokens) at the step deadline.
    assert TTFT_SLO_MS / 1e3 in ttft and round(1.1 * TTFT_SLO_MS / 1e3, 9) in ttft, ttft
    assert ttft[-2] == 3 * STEP_TIMEOUT_S and ttft[-1] == math.inf, ttft
    itl = bounds("superinfer_inter_token_latency_seconds")
    assert TBT_SLO_MS / 1e3 in itl and itl[-2] == STEP_TIMEOUT_S, itl


def test_tgi_request_series_are_exported_for_tgis_dashboard(prometheus, traffic):
    assert prometheus.value(f'sum(tgi_request_count{{container="{CONTAINER}"}})') == traffic + 1
    assert prometheus.value("tgi_request_success") == prometheus.value("superinfer_request_success") == traffic
    assert prometheus.value("sum(tgi_request_failure)") == 1.0
    # TGI's dashboard queries, verbatim but for the container.
    for histogram in ("tgi_request_duration", "tgi_request_queue_duration", "tgi_request_mean_time_per_token_duration",
                      "tgi_request_input_length", "tgi_request_generated_tokens",
                      'tgi_batch_inference_duration{method="prefill"', 'tgi_batch_forward_duration{method="decode"'):
        name, _, selector = histogram.partition("{")
        labels = f'{{{selector}, container="{CONTAINER}"}}' if selector else f'{{container="{CONTAINER}"}}'
        value = prometheus.value(f"histogram_quantile(0.9, sum by (le) ({name}_bucket{labels}))")
        assert value is not None and math.isfinite(value) and value > 0, (histogram, value)
    assert prometheus.value(f'sum(tgi_queue_size{{container="{CONTAINER}"}})') == 0.0
    assert prometheus.value(f'avg(tgi_batch_current_size{{container="{CONTAINER}"}})') == 0.0
    assert prometheus.value("tgi_request_generated_tokens_sum") == 5 * GENERATED + STREAM_TOKENS


def test_every_histogram_has_buckets_and_token_buckets_reach_the_token_limit(prometheus, traffic):
    summaries = prometheus.query('{__name__=~"(superinfer|tgi)_.*", quantile!=""}')
    assert summaries == [], [series["metric"]["__name__"] for series in summaries]
    for histogram in ("tgi_request_input_length", "superinfer_request_max_new_tokens"):
        top = prometheus.value(f'{histogram}_bucket{{le="{MAX_TOTAL_TOKENS}"}}')
        assert top == traffic, (histogram, top)
    assert prometheus.value('superinfer_batch_size_bucket{le="+Inf"}') > 0


def test_every_query_of_our_dashboard_answers(prometheus, traffic):
    dashboard = json.loads((REPO / "docs" / "grafana" / "superinfer.json").read_text())
    # Grafana's variables, as Grafana would fill them in.
    variables = {"$job": "superinfer", "$__rate_interval": "1m", "$__range": "10m"}
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(expressions) > 20
    for expression in expressions:
        for variable, value in variables.items():
            expression = expression.replace(variable, value)
        # rate() needs two samples of a series: one born in the traffic's last scrape (a fast
        # server serves it all within one) answers from the next scrape on (1 s apart).
        assert wait_for(lambda: prometheus.query(expression), timeout_s=15), expression


class HeldStream:
    """A stream that has produced its first token (so it holds KV blocks) and would go on to the
    token limit; it is not read further, and closing it cancels its request."""

    def __init__(self, url: str):
        parameters = {"max_new_tokens": MAX_TOTAL_TOKENS - 100, "ignore_eos": True}
        self.response = requests.post(f"{url}/generate_stream", json={"inputs": PROMPT, "parameters": parameters},
                                      stream=True, timeout=300)
        self.response.raise_for_status()
        # Held on to: a line iterator that is dropped closes the connection, which cancels.
        self.lines = self.response.iter_lines()
        for line in self.lines:
            if line.startswith(b"data:"):
                break

    def close(self) -> None:
        self.response.close()


def test_kv_pools_are_exported_and_return_every_block(server, prometheus, traffic):
    streams = [HeldStream(server.url) for _ in range(2)]
    try:
        both = lambda: prometheus.value("superinfer_engine_requests") == 2.0  # noqa: E731
        assert wait_for(both, timeout_s=30), server.log_tail()
        assert prometheus.value("superinfer_kv_device_blocks_used") > 0
        total = prometheus.value("superinfer_kv_device_blocks_used + superinfer_kv_device_blocks_free")
        assert total == DEVICE_BLOCKS
    finally:
        for stream in streams:
            stream.close()
    # The closed streams cancelled their requests: every block is back in its pool.
    idle = lambda: prometheus.value("superinfer_kv_device_blocks_used") == 0.0  # noqa: E731
    assert wait_for(idle, timeout_s=30), server.log_tail()
    assert prometheus.value("superinfer_kv_device_blocks_free") == DEVICE_BLOCKS
    assert prometheus.value("superinfer_kv_host_blocks_used") == 0.0
    assert prometheus.value("superinfer_kv_host_blocks_free") == HOST_BLOCKS
    assert prometheus.value("superinfer_engine_requests") == 0.0
