"""What the shard measures at warm-up reaches the simulator as data: the JSON written with
`--warmup-report` is the `measured:` profile, field for field the Warmup reply."""
import dataclasses
import logging

from conftest import make_executor

from superinfer.pb import shard_pb2
from superinfer.simulate.profiles import resolve


def test_the_warmup_report_is_the_measured_profile(tiny_llama_dir, tmp_path):
    executor = make_executor(tiny_llama_dir, device_blocks=24, host_blocks=8, warm=False)
    report = tmp_path / "reports" / "warmup.json"
    executor.config = dataclasses.replace(executor.config, warmup_report=report)
    reply = executor.warmup(shard_pb2.WarmupRequest(max_batch_tokens=96, max_batch_requests=6))
    profile = resolve(f"measured:{report}")
    cost = reply.cost_model
    assert profile.cost_model == {
        "step_base_s": cost.step_base_s, "per_prefill_token_s": cost.per_prefill_token_s,
        "per_decode_request_s": cost.per_decode_request_s, "per_context_token_s": cost.per_context_token_s,
        "swap_out_bytes_per_s": cost.swap_out_bytes_per_s, "swap_in_bytes_per_s": cost.swap_in_bytes_per_s,
        "transfer_overhead_s": cost.transfer_overhead_s, "duplex": cost.duplex,
        "token_curve": {"tokens_s": list(cost.token_curve.tokens_s), "decodes_s": list(cost.token_curve.decodes_s),
                        "per_context_token_s": cost.token_curve.per_context_token_s},
    }
    assert len(cost.token_curve.tokens_s) >= 2, "the warm-up measured a token curve"
    assert (profile.num_device_blocks, profile.num_host_blocks) == (24, 8)
    assert (profile.max_batch_tokens, profile.max_batch_requests) == (96, 6)
    assert profile.block_size == executor.runner.block_size
    assert profile.block_bytes == executor.runner.geometry.block_bytes
    assert profile.step_time == {"kind": "linear", **profile.cost_model}


def test_warm_up_logs_each_phase(tiny_llama_dir, caplog):
    executor = make_executor(tiny_llama_dir, device_blocks=24, host_blocks=8, warm=False)
    with caplog.at_level(logging.INFO):
        executor.warmup(shard_pb2.WarmupRequest(max_batch_tokens=96, max_batch_requests=6))
    logged = [record.getMessage() for record in caplog.records]
    expected = ["warm-up: allocating 24 device and 8 host KV blocks", "loading DuplexKV's CPU extension",
                "DuplexKV's CPU extension ready in", "warm-up: timing forward passes of",
                "warm-up: forward passes timed in", "warm-up: timing transfers of 4 blocks each way",
                "warm-up: transfers timed in", "warm-up: 24 device / 8 host KV blocks, measured in"]
    positions = [next((i for i, line in enumerate(logged) if line.startswith(start)), None) for start in expected]
    assert None not in positions and positions == sorted(positions), logged
