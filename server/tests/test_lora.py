"""LoRA adapters in the shard: PEFT adapters (made with PEFT itself on random tiny models) give
the logits and greedy continuations of transformers + PEFT; requests for different adapters
and the base model share one forward and each row gets what it gets alone; two gloo ranks
compute what the whole model computes; unknown and unsupported adapters are refused with the
reason; the flag reaches the shard from the launcher; adapters loaded and unloaded while the
shard serves (LoadAdapter, UnloadAdapter) compute what the same adapters loaded at start-up do,
on one rank and on two, and what cannot be loaded is refused with nothing changed."""
import copy
import json
import pathlib
import shutil
import subprocess
import sys
import time

import peft
import pytest
import torch
import torch.multiprocessing as mp
from conftest import build_tiny_model
from safetensors.torch import load_file, save_file
from test_tensor_parallel import _free_port

from superinfer.pb import shard_pb2 as pb
from superinfer.shard import lora as shard_lora
from superinfer.shard.batch import Chunk
from superinfer.shard.config import LoraAdapterSpec, ShardConfig, parse_lora_adapters
from superinfer.shard.errors import AdapterRequestError, LoraError, PlanError
from superinfer.shard.hub import HubOptions

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name -> PEFT LoraConfig arguments: different ranks and targets, rsLoRA, rank/alpha patterns.
ADAPTERS = {
    "qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "all": dict(r=8, lora_alpha=16, target_modules=ALL_TARGETS),
    "rslora": dict(r=16, lora_alpha=8, target_modules=ALL_TARGETS, use_rslora=True),
    "patterns": dict(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj", "gate_proj", "down_proj"],
                     rank_pattern={"o_proj": 2}, alpha_pattern={"gate_proj": 12}),
}
PROMPT = list(range(3, 30))


def make_adapter(base, directory: pathlib.Path, seed: int, **lora_config):
    """Saves a PEFT LoRA adapter of `base` (a transformers model) with random A and B (PEFT
    starts B at zero, which would make every adapter the base model); returns the PEFT model."""
    model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(**lora_config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    model.save_pretrained(directory)
    return model.eval()


@pytest.fixture(scope="module")
def adapted(tmp_path_factory):
    """A tiny Llama, its adapters (directories and PEFT models) by name."""
    root = tmp_path_factory.mktemp("lora")
    base = build_tiny_model(root / "base", "llama")
    models = {name: make_adapter(base, root / name, seed, **config)
              for seed, (name, config) in enumerate(ADAPTERS.items())}
    return root, base, models


def lora_runner(directory: pathlib.Path, adapters: dict[str, pathlib.Path], group=None, blocks: int = 32):
    from superinfer.shard.loader import load_model
    from superinfer.shard.lora import load_adapters
    from superinfer.shard.model_runner import ModelRunner
    from superinfer.shard.model_source import ModelSource

    loaded = load_model(ModelSource(str(directory), directory), torch.float32, torch.device("cpu"), group)
    specs = tuple(LoraAdapterSpec(name, str(path)) for name, path in adapters.items())
    loaded = load_adapters(loaded, specs, HubOptions(offline=True))
    runner = ModelRunner(loaded, torch.device("cpu"), torch.float32, 16)
    runner.allocate(blocks, 0)
    return runner


def forward_logits(runner, chunks: list[Chunk]) -> list[torch.Tensor]:
    """Each chunk's logits [len, vocab] from one forward over all of them (None on the ranks
    > 0 of a tensor-parallel model)."""
    hidden, batch = runner.forward(chunks)
    logits = runner.logits(hidden)
    if logits is None:
        return None
    return [logits[first : first + len(chunk.token_ids)] for first, chunk in zip(batch.first_rows, chunks)]


def greedy(runner, prompt: list[int], steps: int, blocks: list[int], adapter: int) -> list[int]:
    tokens = [int(forward_logits(runner, [Chunk(prompt, 0, blocks, adapter)])[0][-1].argmax())]
    for index in range(steps - 1):
        logits = forward_logits(runner, [Chunk([tokens[-1]], len(prompt) + index, blocks, adapter)])[0]
        tokens.append(int(logits[-1].argmax()))
    return tokens


def reference_greedy(model, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_each_adapter_gives_peft_logits_and_greedy_tokens(adapted):
    root, base, models = adapted
    runner = lora_runner(root / "base", {name: root / name for name in ADAPTERS})
    assert runner.loaded.adapters == tuple(ADAPTERS)
    with torch.no_grad():
        base_logits = base(torch.tensor([PROMPT])).logits[0]
    for slot, (name, model) in enumerate(models.items(), start=1):
        with torch.no_grad():
            expected = model(torch.tensor([PROMPT])).logits[0]
        assert (expected - base_logits).abs().max() > 0.5, f"{name} changes nothing: the test would prove nothing"
        got = forward_logits(runner, [Chunk(PROMPT, 0, [0, 1], slot)])[0]
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-3, msg=name)
        assert greedy(runner, PROMPT, 8, [0, 1, 2], slot) == reference_greedy(model, PROMPT, 8), name
    # Slot 0 is the base model.
    torch.testing.assert_close(forward_logits(runner, [Chunk(PROMPT, 0, [0, 1])])[0], base_logits, rtol=0, atol=1e-3)


def _mixed_chunks() -> list[tuple[list[int], int]]:
    # (prompt, slot): the base model, adapter 1 twice (rows not contiguous), 2, 3 and 4.
    return [(PROMPT, 0), (list(range(40, 52)), 1), (PROMPT[:9], 2), (list(range(60, 75)), 1), (PROMPT[3:], 3),
            (list(range(80, 90)), 4)]


def test_a_mixed_batch_gives_each_row_what_it_gets_alone(adapted):
    root, _, _ = adapted
    runner = lora_runner(root / "base", {name: root / name for name in ADAPTERS}, blocks=64)
    requests = _mixed_chunks()
    tables = [[2 * i, 2 * i + 1] for i in range(len(requests))]
    alone = [forward_logits(runner, [Chunk(prompt, 0, table, slot)])[0]
             for (prompt, slot), table in zip(requests, tables)]
    # A prefill chunk of each request in one forward (fresh blocks), then one decode of each.
    fresh = [[t + 20 for t in table] for table in tables]
    together = forward_logits(runner, [Chunk(prompt, 0, table, slot) for (prompt, slot), table in zip(requests, fresh)])
    for got, want in zip(together, alone):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # Then a decode of each beside a new prompt's prefill (adapter 2): both groups in one step.
    decodes = [Chunk([7], len(prompt), table, slot) for (prompt, slot), table in zip(requests, fresh)]
    together = forward_logits(runner, [*decodes, Chunk(PROMPT[:12], 0, [60, 61], 2)])
    alone = [forward_logits(runner, [Chunk([7], len(prompt), table, slot)])[0]
             for (prompt, slot), table in zip(requests, tables)]
    alone.append(forward_logits(runner, [Chunk(PROMPT[:12], 0, [62, 63], 2)])[0])
    for got, want in zip(together, alone, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def _rank(rank: int, world_size: int, directory: str, adapters: dict, port: int, results: str) -> None:
    from superinfer.shard.config import ParallelConfig
    from superinfer.shard.rank_group import RankGroup

    torch.set_num_threads(1)
    group = RankGroup(ParallelConfig(rank, world_size, "127.0.0.1", port, 60.0), torch.device("cpu"))
    try:
        runner = lora_runner(pathlib.Path(directory), adapters, group.tensor_parallel, blocks=48)
        logits = _tensor_parallel_steps(runner)
        torch.save(logits if rank == 0 else None, f"{results}.{rank}")
    finally:
        group.close()


def _tensor_parallel_steps(runner) -> list[list[torch.Tensor]]:
    """A mixed prefill, then a mixed step of decodes."""
    requests = _mixed_chunks()
    tables = [[2 * i, 2 * i + 1] for i in range(len(requests))]
    first = forward_logits(runner, [Chunk(prompt, 0, table, slot) for (prompt, slot), table in zip(requests, tables)])
    second = forward_logits(runner, [Chunk([9], len(prompt), table, slot)
                                     for (prompt, slot), table in zip(requests, tables)])
    return [first, second]


@pytest.mark.parametrize("kv_heads", [2, 1])  # split over the ranks, then replicated on both
def test_gloo_ranks_with_adapters_compute_the_whole_models_logits(tmp_path, kv_heads):
    base = build_tiny_model(tmp_path / "base", "llama", num_attention_heads=4, num_key_value_heads=kv_heads)
    adapters = {name: tmp_path / name for name in ADAPTERS}
    for seed, (name, config) in enumerate(ADAPTERS.items()):
        make_adapter(base, adapters[name], seed, **config)
    expected = _tensor_parallel_steps(lora_runner(tmp_path / "base", adapters, blocks=48))
    results = str(tmp_path / "rank")
    mp.spawn(_rank, args=(2, str(tmp_path / "base"), {k: str(v) for k, v in adapters.items()}, _free_port(), results),
             nprocs=2, join=True)
    got = torch.load(f"{results}.0", weights_only=False)
    for got_step, expected_step in zip(got, expected):
        for got_rows, expected_rows in zip(got_step, expected_step):
            torch.testing.assert_close(got_rows, expected_rows, rtol=1e-4, atol=1e-4)


# A Qwen3-MoE whose layer 0 keeps a dense MLP (mlp_only_layers) and layer 1 is sparse.
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[0])


@pytest.mark.parametrize("architecture, targets, overrides", [
    ("qwen2", ALL_TARGETS, {}),  # Q/K/V biases in the base model
    # Attention only (PEFT turns MLP targets of a MoE model into its experts' parameters).
    ("qwen3_moe", ["q_proj", "k_proj", "v_proj", "o_proj"], MOE),
    ("gemma2", ALL_TARGETS, {}),  # its own layer forward and GeLU-tanh MLP
    # Its own layer forward: each block's output, LoRA delta included, times the residual multiplier.
    ("granite", ALL_TARGETS, {"embedding_multiplier": 6.0, "residual_multiplier": 0.3, "logits_scaling": 4.0}),
    # Checkpoints with fused projections: the adapter's are fused too.
    ("phi3", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], {"pad_token_id": 0}),
])
def test_other_architectures_of_the_shared_decoder_take_adapters(tmp_path, architecture, targets, overrides):
    base = build_tiny_model(tmp_path / "base", architecture, **overrides)
    model = make_adapter(base, tmp_path / "adapter", 0, r=4, lora_alpha=8, target_modules=targets)
    runner = lora_runner(tmp_path / "base", {"a": tmp_path / "adapter"})
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(forward_logits(runner, [Chunk(PROMPT, 0, [0, 1], 1)])[0], expected, rtol=0, atol=1e-3)


def _shard_config(directory: pathlib.Path, adapters: dict[str, pathlib.Path], **options) -> ShardConfig:
    return ShardConfig(
        model=str(directory), cache_dir=directory / "cache", device=torch.device("cpu"), dtype=torch.float32,
        device_kv_blocks=32, host_kv_blocks=4, warmup_repeats=1,
        lora_adapters=tuple(LoraAdapterSpec(name, str(path)) for name, path in adapters.items()), **options,
    )


def _executor(directory: pathlib.Path, adapters: dict[str, pathlib.Path]):
    from superinfer.shard.cli import build_executor

    executor = build_executor(_shard_config(directory, adapters))
    executor.warmup(pb.WarmupRequest(max_batch_tokens=128, max_batch_requests=8))
    return executor


def _schedule(rid: int, count: int, block: int):
    return pb.ScheduledRequest(id=rid, num_computed_tokens=0, num_new_tokens=count, block_table=[block], sample=True)


def test_requests_name_their_adapter_and_an_unknown_one_is_refused(adapted):
    root, base, models = adapted
    executor = _executor(root / "base", {"qv": root / "qv", "all": root / "all"})
    assert list(executor.info().adapters) == ["qv", "all"]
    prompt = PROMPT[:10]
    reply = executor.step(pb.StepRequest(step_id=1, new_requests=[
        pb.NewRequest(id=1, prompt_token_ids=prompt), pb.NewRequest(id=2, prompt_token_ids=prompt, adapter_id="qv"),
        pb.NewRequest(id=3, prompt_token_ids=prompt, adapter_id="all"),
    ], scheduled=[_schedule(1, 10, 0), _schedule(2, 10, 1), _schedule(3, 10, 2)]))
    expected = [reference_greedy(model, prompt, 1)[0] for model in (base, models["qv"], models["all"])]
    assert [output.token.id for output in reply.outputs] == expected
    assert executor.requests[2].adapter == 1 and executor.requests[3].adapter == 2
    with pytest.raises(PlanError, match="request 4: unknown LoRA adapter 'rslora' \\(loaded: 'qv', 'all'\\)"):
        executor.step(pb.StepRequest(step_id=2, new_requests=[
            pb.NewRequest(id=4, prompt_token_ids=prompt, adapter_id="rslora")], scheduled=[_schedule(4, 10, 3)]))
    assert 4 not in executor.requests
    executor.close()


def _broken_copy(source: pathlib.Path, target: pathlib.Path, config: dict | None = None,
                 tensors=None) -> pathlib.Path:
    shutil.copytree(source, target)
    if config:
        raw = json.loads((target / "adapter_config.json").read_text())
        (target / "adapter_config.json").write_text(json.dumps({**raw, **config}))
    if tensors is not None:
        path = target / "adapter_model.safetensors"
        save_file(tensors(load_file(path)), path)
    return target


def _expert_tensor(tensors: dict) -> dict:
    name = "base_model.model.model.layers.0.mlp.experts.0.gate_proj.lora_A.weight"
    return {**tensors, name: torch.zeros(4, 64)}


def _wrong_shape(tensors: dict) -> dict:
    name = "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"
    return {**tensors, name: torch.zeros(32, tensors[name].shape[1])}


def _far_layer(tensors: dict) -> dict:
    return {name.replace("layers.1.", "layers.7."): tensor for name, tensor in tensors.items()}


BAD_ADAPTERS = {
    "DoRA (use_dora)": dict(config={"use_dora": True}),
    "modules_to_save": dict(config={"modules_to_save": ["lm_head"]}),
    "trained biases (bias='all'": dict(config={"bias": "all"}),
    "only LORA adapters": dict(config={"peft_type": "IA3"}),
    "a sparse MLP's experts": dict(tensors=_expert_tensor),
    "needs [r, 64] and [64, r]": dict(tensors=_wrong_shape),
    "in layer 7; the model has 2 layers": dict(tensors=_far_layer),
    "has LoRA rank 4 where adapter_config.json says 3": dict(config={"r": 3}),
}


@pytest.mark.parametrize("reason", BAD_ADAPTERS)
def test_unsupported_adapters_are_refused_with_the_reason(adapted, tmp_path, reason):
    from superinfer.shard.loader import load_model
    from superinfer.shard.lora import load_adapters
    from superinfer.shard.model_source import ModelSource

    root, _, _ = adapted
    broken = _broken_copy(root / "qv", tmp_path / "broken", **BAD_ADAPTERS[reason])
    loaded = load_model(ModelSource("base", root / "base"), torch.float32, torch.device("cpu"))
    with pytest.raises(LoraError, match=r"LoRA adapter 'bad' \(.*broken\): ") as err:
        load_adapters(loaded, (LoraAdapterSpec("bad", str(broken)),), HubOptions(offline=True))
    assert reason in str(err.value)


def _with_mlp_tensors(layer: int):
    def add(tensors: dict) -> dict:
        rank = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape[0]
        prefix = f"base_model.model.model.layers.{layer}.mlp.gate_proj"
        return {**tensors, f"{prefix}.lora_A.weight": torch.ones(rank, 64),
                f"{prefix}.lora_B.weight": torch.ones(128, rank)}
    return add


def test_adapters_on_a_sparse_mlp_are_refused(tmp_path):
    from superinfer.shard.loader import load_model
    from superinfer.shard.lora import load_adapters
    from superinfer.shard.model_source import ModelSource

    base = build_tiny_model(tmp_path / "base", "qwen3_moe", **MOE)

    def load(directory: pathlib.Path):
        loaded = load_model(ModelSource("base", tmp_path / "base"), torch.float32, torch.device("cpu"))
        return load_adapters(loaded, (LoraAdapterSpec("moe", str(directory)),), HubOptions(offline=True))

    # PEFT makes MLP targets of a MoE model LoRAs on its experts' parameters.
    make_adapter(base, tmp_path / "experts", 0, r=4, lora_alpha=8, target_modules=["q_proj", "gate_proj", "up_proj"])
    with pytest.raises(LoraError, match=r"LoRA on parameters \(target_parameters, e.g. a sparse MLP's experts\)"):
        load(tmp_path / "experts")
    make_adapter(base, tmp_path / "attention", 0, r=4, lora_alpha=8, target_modules=["q_proj"])
    # A dense MLP's projections (layer 0) take one; layer 1's mixture of experts does not.
    assert load(_broken_copy(tmp_path / "attention", tmp_path / "dense", tensors=_with_mlp_tensors(0))).adapters
    with pytest.raises(LoraError, match="layer 1's MLP is a SparseMoeBlock .LoRA on a sparse MLP's experts"):
        load(_broken_copy(tmp_path / "attention", tmp_path / "sparse", tensors=_with_mlp_tensors(1)))


def test_serve_exits_with_the_reason_for_a_bad_adapter(adapted, tmp_path):
    root, _, _ = adapted
    broken = _broken_copy(root / "qv", tmp_path / "dora", config={"use_dora": True})
    done = subprocess.run(
        [sys.executable, "-m", "superinfer.cli", "serve", "--uds-path", str(tmp_path / "s.sock"), "--device", "cpu",
         "--model", str(root / "base"), "--cache-dir", str(tmp_path / "cache"), "--lora-adapters", f"dora={broken}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "cannot serve the LoRA adapters: LoRA adapter 'dora'" in done.stderr and "DoRA (use_dora)" in done.stderr


def test_the_flag_is_parsed_once_into_ids_and_sources():
    assert parse_lora_adapters(None) == parse_lora_adapters(" ") == ()
    assert parse_lora_adapters("a=/x/a, org/name ,b = ./b") == (
        LoraAdapterSpec("a", "/x/a"), LoraAdapterSpec("org/name", "org/name"), LoraAdapterSpec("b", "./b"))
    for bad, message in (("a=/x,a=/y", "names the adapter id 'a' twice"), ("=/x", "id=path or a path"),
                         ("a=", "id=path or a path")):
        with pytest.raises(ValueError, match=message):
            parse_lora_adapters(bad)


def test_the_launcher_forwards_the_adapters_to_the_shard(monkeypatch):
    import argparse

    from superinfer import launch_config, launcher

    monkeypatch.setenv("LORA_ADAPTERS", "a=/x/a,b")
    parser = argparse.ArgumentParser()
    launch_config.add_arguments(parser)
    config = launch_config.from_args(parser.parse_args([]), {})
    argv = launcher.shard_argv(config, pathlib.Path("/tmp/s.sock"))
    assert argv[argv.index("--lora-adapters") + 1] == "a=/x/a,b"
    with pytest.raises(ValueError, match="twice"):
        launch_config.from_args(parser.parse_args(["--lora-adapters", "a,a"]), {})


def test_a_steps_rows_are_grouped_by_adapter():
    from superinfer.models.lora import lora_batch

    assert lora_batch([(0, 3, 0), (3, 1, 0)], torch.device("cpu")) is None  # base rows only: no LoRA work
    batch = lora_batch([(0, 3, 0), (3, 2, 1), (5, 1, 2), (6, 4, 1), (10, 2, 2)], torch.device("cpu"))
    first, second = batch.groups
    assert (first.slot, first.index.tolist()) == (1, [3, 4, 6, 7, 8, 9])
    assert (second.slot, second.index.tolist()) == (2, [5, 10, 11])
    # Adjacent spans of one adapter merge into one slice.
    (merged,) = lora_batch([(0, 2, 3), (2, 5, 3)], torch.device("cpu")).groups
    assert (merged.slot, merged.start, merged.stop, merged.index) == (3, 0, 7, None)


def _generate(executor, rid: int, prompt: list[int], block: int, steps: int = 4, **adapter) -> list[int]:
    """`steps` greedy tokens of a new request (its `adapter_id` / `adapter_slot` as given), one
    step each, in device block `block`."""
    reply = executor.step(pb.StepRequest(new_requests=[pb.NewRequest(id=rid, prompt_token_ids=prompt, **adapter)],
                                         scheduled=[_schedule(rid, len(prompt), block)]))
    tokens = [reply.outputs[0].token.id]
    for _ in range(steps - 1):
        reply = executor.step(pb.StepRequest(scheduled=[_decode(rid, len(prompt) + len(tokens) - 1, block)]))
        tokens.append(reply.outputs[0].token.id)
    return tokens


def _decode(rid: int, computed: int, block: int):
    return pb.ScheduledRequest(id=rid, num_computed_tokens=computed, num_new_tokens=1, block_table=[block],
                               sample=True)


def _installed_slots(executor) -> set[int]:
    from superinfer.models.lora import LoraLinear

    return {slot for module in executor.runner.model.modules() if isinstance(module, LoraLinear)
            for slot in module.adapters}


def _adapters(executor) -> list[tuple[str, int]]:
    info = executor.info()
    return list(zip(info.adapters, info.adapter_slots, strict=True))


def test_an_adapter_loaded_at_runtime_runs_as_at_start_up_until_it_is_unloaded(adapted):
    root, base, models = adapted
    prompt = PROMPT[:10]
    at_start = _executor(root / "base", {"qv": root / "qv", "all": root / "all"})
    assert _adapters(at_start) == [("qv", 1), ("all", 2)]
    expected = _generate(at_start, 1, prompt, 0, adapter_id="all", adapter_slot=2)
    at_start.close()
    assert expected == reference_greedy(models["all"], prompt, 4)
    base_tokens = reference_greedy(base, prompt, 4)

    executor = _executor(root / "base", {})  # warmed up without an adapter
    assert _adapters(executor) == [] and _generate(executor, 1, prompt, 0) == base_tokens
    executor.load_adapter("all", str(root / "all"), 7)
    assert _adapters(executor) == [("all", 7)]
    # A base request and one naming the adapter (by slot, then by id only) in one step.
    reply = executor.step(pb.StepRequest(new_requests=[
        pb.NewRequest(id=2, prompt_token_ids=prompt), pb.NewRequest(id=3, prompt_token_ids=prompt, adapter_id="all",
                                                                    adapter_slot=7),
    ], scheduled=[_schedule(2, 10, 1), _schedule(3, 10, 2)]))
    assert [output.token.id for output in reply.outputs] == [base_tokens[0], expected[0]]
    assert executor.requests[3].adapter == 7
    assert _generate(executor, 4, prompt, 3, adapter_id="all") == expected and executor.requests[4].adapter == 7
    assert _generate(executor, 5, prompt, 4) == base_tokens

    executor.unload_adapter(7)
    assert _adapters(executor) == [] and _installed_slots(executor) == set()
    with pytest.raises(PlanError, match="request 6: LoRA adapter slot 7 holds no adapter, not 'all'"):
        _generate(executor, 6, prompt, 5, adapter_id="all", adapter_slot=7)
    with pytest.raises(PlanError, match=r"request 6: unknown LoRA adapter 'all' \(loaded: none\)"):
        _generate(executor, 6, prompt, 5, adapter_id="all")
    # A request still registered with it (the router forgets it first) is refused, not run as the base model.
    with pytest.raises(PlanError, match="request 3 runs with LoRA adapter slot 7, which holds no adapter any more"):
        executor.step(pb.StepRequest(scheduled=[_decode(3, 10, 2)]))
    assert 6 not in executor.requests
    assert _generate(executor, 6, prompt, 5) == base_tokens
    executor.close()


def test_loads_and_unloads_that_cannot_be_done_are_refused_and_change_nothing(adapted, tmp_path):
    root, _, _ = adapted
    executor = _executor(root / "base", {"qv": root / "qv"})
    before = _adapters(executor)
    dora = _broken_copy(root / "all", tmp_path / "dora", config={"use_dora": True})
    refused = {
        "slot 0 is the base model's": lambda: executor.load_adapter("all", str(root / "all"), 0),
        "LoRA adapter 'all': slot 1 holds 'qv' already": lambda: executor.load_adapter("all", str(root / "all"), 1),
        "a LoRA adapter for slot 2 needs an id": lambda: executor.load_adapter("", str(root / "all"), 2),
        "LoRA adapter 'x': no source": lambda: executor.load_adapter("x", "", 2),
        "LoRA adapter 'dora' (": lambda: executor.load_adapter("dora", str(dora), 2),
        "DoRA (use_dora)": lambda: executor.load_adapter("dora", str(dora), 2),
        "is not a directory": lambda: executor.load_adapter("gone", str(tmp_path / "no" / "such"), 2),
        "LoRA adapter slot 2 holds no adapter (loaded: 'qv' in slot 1)": lambda: executor.unload_adapter(2),
        "slot 0 holds no adapter": lambda: executor.unload_adapter(0),
    }
    for message, call in refused.items():
        with pytest.raises(AdapterRequestError) as err:
            call()
        assert message in str(err.value), (message, str(err.value))
        assert _adapters(executor) == before and _installed_slots(executor) == {1}, message
    # Still serving its adapter.
    assert executor.limits.adapters == {1: "qv"}
    new = pb.NewRequest(id=1, prompt_token_ids=PROMPT[:10], adapter_id="qv")
    assert executor.step(pb.StepRequest(new_requests=[new], scheduled=[_schedule(1, 10, 0)])).outputs[0].HasField("token")
    # Two loads read at once for one slot: the one installed second is refused then.
    first, same_slot = (executor.prepare_adapter(adapter_id, str(root / "all"), 2) for adapter_id in ("all", "other"))
    executor.install_prepared(first)
    with pytest.raises(AdapterRequestError, match="slot 2 holds 'all' already"):
        executor.install_prepared(same_slot)
    assert _adapters(executor) == [("qv", 1), ("all", 2)] and _installed_slots(executor) == {1, 2}
    executor.close()


def test_a_load_too_large_for_the_memory_free_is_refused_and_changes_nothing(adapted, monkeypatch):
    root, _, _ = adapted
    executor = _executor(root / "base", {"qv": root / "qv"})
    read = shard_lora.read_adapter(LoraAdapterSpec("all", str(root / "all")), executor.runner.loaded, HubOptions())
    needed = shard_lora.adapter_bytes(read, torch.float32)
    assert needed == sum((a.numel() + b.numel()) * 4 for a, b in read.tensors.values()) > 0
    # The host's real free memory takes it.
    assert shard_lora.free_memory_bytes(torch.device("cpu")) > 2 * needed
    # With less than twice its size free, the load is refused, saying how much it needs.
    monkeypatch.setattr(shard_lora, "free_memory_bytes", lambda device: 2 * needed - 1)
    with pytest.raises(AdapterRequestError, match=rf"'all': its weights take {needed / 2**20:.1f} MiB on cpu, more than 50%"):
        executor.load_adapter("all", str(root / "all"), 2)
    assert _adapters(executor) == [("qv", 1)] and _installed_slots(executor) == {1}
    monkeypatch.setattr(shard_lora, "free_memory_bytes", lambda device: 2 * needed)
    executor.load_adapter("all", str(root / "all"), 2)
    assert _adapters(executor) == [("qv", 1), ("all", 2)] and _installed_slots(executor) == {1, 2}
    executor.close()


def test_an_adapter_replaced_in_place_is_in_two_slots_until_the_old_one_is_unloaded(adapted):
    # The router's load_inplace: new weights under the same id in a new slot; requests name the
    # slot they run with, and one naming the id alone gets the newest.
    root, _, models = adapted
    prompt = PROMPT[:10]
    executor = _executor(root / "base", {"tuned": root / "qv"})
    executor.load_adapter("tuned", str(root / "all"), 2)
    assert _adapters(executor) == [("tuned", 1), ("tuned", 2)] and _installed_slots(executor) == {1, 2}
    old, new = reference_greedy(models["qv"], prompt, 4), reference_greedy(models["all"], prompt, 4)
    assert old != new
    assert _generate(executor, 1, prompt, 0, adapter_id="tuned", adapter_slot=1) == old
    assert _generate(executor, 2, prompt, 0, adapter_id="tuned", adapter_slot=2) == new
    assert _generate(executor, 3, prompt, 0, adapter_id="tuned") == new
    executor.unload_adapter(1)
    assert _adapters(executor) == [("tuned", 2)] and _installed_slots(executor) == {2}
    assert _generate(executor, 4, prompt, 0, adapter_id="tuned") == new
    executor.close()


def test_a_slot_must_hold_the_adapter_named_and_an_unloaded_one_reloads_in_a_new_slot(adapted):
    root, _, models = adapted
    prompt = PROMPT[:10]
    expected = reference_greedy(models["qv"], prompt, 4)
    executor = _executor(root / "base", {})
    executor.load_adapter("qv", str(root / "qv"), 3)
    for adapter_id, slot, message in (("all", 3, "slot 3 holds LoRA adapter 'qv', not 'all'"),
                                      ("qv", 4, "slot 4 holds no adapter, not 'qv'"),
                                      ("", 3, "slot 3 holds LoRA adapter 'qv', not ''")):
        with pytest.raises(PlanError, match=f"request 1: LoRA adapter {message} \\(loaded: 'qv' in slot 3\\)"):
            _generate(executor, 1, prompt, 0, adapter_id=adapter_id, adapter_slot=slot)
    assert _generate(executor, 1, prompt, 0, adapter_id="qv", adapter_slot=3) == expected
    executor.unload_adapter(3)
    executor.load_adapter("qv", str(root / "qv"), 4)
    assert _adapters(executor) == [("qv", 4)] and _installed_slots(executor) == {4}
    with pytest.raises(PlanError, match="slot 3 holds no adapter"):
        _generate(executor, 2, prompt, 1, adapter_id="qv", adapter_slot=3)
    assert _generate(executor, 2, prompt, 1, adapter_id="qv", adapter_slot=4) == expected
    assert _generate(executor, 3, prompt, 2, adapter_id="qv") == expected and executor.requests[3].adapter == 4
    executor.close()


def test_load_and_unload_over_grpc_refusals_are_invalid_argument(adapted, tmp_path):
    import grpc

    from superinfer.pb import shard_pb2_grpc
    from superinfer.shard.server import ShardServer

    root, _, models = adapted
    server = ShardServer(_executor(root / "base", {"qv": root / "qv"}), tmp_path / "shard.sock")
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path / 'shard.sock'}")
    stub = shard_pb2_grpc.ShardStub(channel)
    try:
        assert stub.LoadAdapter(pb.LoadAdapterRequest(adapter_id="all", source=str(root / "all"), slot=2)) == \
            pb.LoadAdapterResponse()
        info = stub.Info(pb.InfoRequest())
        assert (list(info.adapters), list(info.adapter_slots)) == (["qv", "all"], [1, 2])
        for call, message in (
            (lambda: stub.LoadAdapter(pb.LoadAdapterRequest(adapter_id="x", source=str(root / "all"), slot=2)),
             "LoRA adapter 'x': slot 2 holds 'all' already"),
            (lambda: stub.LoadAdapter(pb.LoadAdapterRequest(adapter_id="dora", source=str(
                _broken_copy(root / "all", tmp_path / "dora", config={"use_dora": True})), slot=3)),
             "DoRA (use_dora)"),
            (lambda: stub.UnloadAdapter(pb.UnloadAdapterRequest(slot=5)), "LoRA adapter slot 5 holds no adapter"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details()
        stub.Warmup(pb.WarmupRequest(max_batch_tokens=128, max_batch_requests=8))
        new = pb.NewRequest(id=1, prompt_token_ids=PROMPT[:10], adapter_id="all", adapter_slot=2)
        reply = stub.Step(pb.StepRequest(new_requests=[new], scheduled=[_schedule(1, 10, 0)]))
        assert reply.outputs[0].token.id == reference_greedy(models["all"], PROMPT[:10], 1)[0]
        assert stub.UnloadAdapter(pb.UnloadAdapterRequest(slot=2)) == pb.UnloadAdapterResponse()
        info = stub.Info(pb.InfoRequest())
        assert (list(info.adapters), list(info.adapter_slots)) == (["qv"], [1])
    finally:
        channel.close()
        server.stop(grace_s=1)


def _runtime_rank(rank: int, world_size: int, directory: str, adapter: str, port: int, results: str) -> None:
    """One rank of a shard started without adapters: rank 0 loads `adapter` at runtime and runs
    steps with it (the other rank follows rank 0's commands), then unloads it."""
    from superinfer.shard.cli import build_executor
    from superinfer.shard.config import ParallelConfig
    from superinfer.shard.follower import follow
    from superinfer.shard.rank_group import RankGroup

    torch.set_num_threads(1)
    parallel = ParallelConfig(rank, world_size, "127.0.0.1", port, 60.0)
    group = RankGroup(parallel, torch.device("cpu"))
    try:
        executor = build_executor(_shard_config(pathlib.Path(directory), {}, parallel=parallel), group)
        if rank > 0:
            torch.save(follow(executor, group), f"{results}.{rank}")
            return
        try:
            torch.save(_runtime_steps(executor, adapter, 5), f"{results}.0")
        finally:
            executor.close()
    finally:
        group.close()


def _runtime_steps(executor, adapter: str | None, slot: int) -> dict:
    """Prompt logprobs and greedy tokens of a request with the adapter "a" (in `slot`) and one
    without; with `adapter`, the shard loads it in `slot` after warm-up and unloads it at the end."""
    executor.warmup(pb.WarmupRequest(max_batch_tokens=128, max_batch_requests=8))
    if adapter is not None:
        executor.load_adapter("a", adapter, slot)
    reply = executor.step(pb.StepRequest(new_requests=[
        pb.NewRequest(id=1, prompt_token_ids=PROMPT, prompt_logprobs=True, adapter_id="a", adapter_slot=slot),
        pb.NewRequest(id=2, prompt_token_ids=PROMPT, prompt_logprobs=True),
    ], scheduled=[pb.ScheduledRequest(id=rid, num_new_tokens=len(PROMPT), block_table=[2 * rid, 2 * rid + 1],
                                      sample=True) for rid in (1, 2)]))
    result = {"prompt_logprobs": [list(output.prompt_logprobs) for output in reply.outputs],
              "tokens": [[output.token.id] for output in reply.outputs]}
    for index in range(3):
        reply = executor.step(pb.StepRequest(scheduled=[
            pb.ScheduledRequest(id=rid, num_computed_tokens=len(PROMPT) + index, num_new_tokens=1,
                                block_table=[2 * rid, 2 * rid + 1], sample=True) for rid in (1, 2)]))
        for tokens, output in zip(result["tokens"], reply.outputs):
            tokens.append(output.token.id)
    if adapter is not None:
        executor.unload_adapter(slot)
        result["after_unload"] = _adapters(executor)
    return result


def test_gloo_ranks_load_an_adapter_at_runtime_and_compute_what_one_process_does(tmp_path):
    base = build_tiny_model(tmp_path / "base", "llama", num_attention_heads=4, num_key_value_heads=2)
    make_adapter(base, tmp_path / "adapter", 0, **ADAPTERS["all"])
    from superinfer.shard.cli import build_executor

    alone = build_executor(_shard_config(tmp_path / "base", {"a": tmp_path / "adapter"}))
    expected = _runtime_steps(alone, None, 1)  # loaded at start-up: slot 1
    alone.close()
    results = str(tmp_path / "rank")
    mp.spawn(_runtime_rank, args=(2, str(tmp_path / "base"), str(tmp_path / "adapter"), _free_port(), results),
             nprocs=2, join=True)
    got = torch.load(f"{results}.0", weights_only=False)
    assert torch.load(f"{results}.1", weights_only=False) == 0  # the follower ran every command and stopped
    assert got["after_unload"] == []
    assert got["tokens"] == expected["tokens"]
    assert expected["prompt_logprobs"][0] != pytest.approx(expected["prompt_logprobs"][1], abs=1e-2)  # it adapts
    for got_logprobs, expected_logprobs in zip(got["prompt_logprobs"], expected["prompt_logprobs"], strict=True):
        assert got_logprobs == pytest.approx(expected_logprobs, abs=1e-4)


class _Commands:
    """Rank 0's side of a follower's group: hands it `commands` one by one, noting the adapters
    the follower holds before each."""

    rank = 1

    def __init__(self, executor, commands: list):
        self.executor, self.commands = executor, commands
        self.seen: list = []
        self.failure = None
        self.answers: list[float] = []

    def receive(self):
        self.seen.append((_adapters(self.executor), _installed_slots(self.executor)))
        return self.commands.pop(0)

    def fail(self, reason: str) -> None:
        self.failure = reason

    def minimum(self, values: list[float]) -> list[float]:
        self.answers.append(values[0])
        return values


class _PollingCommands(_Commands):
    """As `_Commands`, and asks an `AdapterReadCommand` again while the follower answers 0
    (still reading), as rank 0 polls."""

    def __init__(self, executor, commands: list):
        super().__init__(executor, commands)
        self._asked = None

    def receive(self):
        if self._asked is not None and self.answers and self.answers[-1] == 0.0:
            self.answers.pop()
            time.sleep(0.01)
            return self._asked
        command = super().receive()
        self._asked = command if type(command).__name__ == "AdapterReadCommand" else None
        return command


def test_a_follower_reads_an_adapter_beside_its_steps_and_installs_what_it_read(adapted, monkeypatch):
    """Rank 0's ReadAdapterCommand has the follower read its share on a thread of its own (its
    model thread goes on with the steps); it installs only on LoadAdapterCommand. A read that
    fails is reported (-1) and dropped, and the follower goes on: rank 0 refuses that load."""
    import threading

    from superinfer.shard import executor as executor_module
    from superinfer.shard.cli import build_executor
    from superinfer.shard.follower import follow
    from superinfer.shard.rank_commands import (AdapterReadCommand, DropAdapterReadCommand, LoadAdapterCommand,
                                                ReadAdapterCommand, StopCommand)

    read_on = []
    original = executor_module.read_adapter

    def read_adapter(*args):
        read_on.append(threading.current_thread().name)
        return original(*args)

    monkeypatch.setattr(executor_module, "read_adapter", read_adapter)
    root, _, _ = adapted
    executor = build_executor(_shard_config(root / "base", {}))
    group = _PollingCommands(executor, [
        ReadAdapterCommand("qv", "org/qv", 3, directory=str(root / "qv")), AdapterReadCommand(3),
        LoadAdapterCommand("qv", 3),
        ReadAdapterCommand("gone", str(root / "gone"), 4), AdapterReadCommand(4), DropAdapterReadCommand(4),
        AdapterReadCommand(5),  # never asked to read: a failure, not a wait
        StopCommand()])
    assert follow(executor, group) == 0 and group.failure is None
    assert group.answers == [1.0, -1.0, -1.0]
    assert read_on and all(name.startswith("adapter-read") for name in read_on)
    # Installed by the load command only, from what was read; nothing of the failed one.
    assert [seen for seen, _ in group.seen] == [[], [], [], [("qv", 3)], [("qv", 3)], [("qv", 3)], [("qv", 3)],
                                                [("qv", 3)]]
    assert executor._reads == {}
    executor.close()


class _Followers:
    """The other ranks as rank 0 sees them: the commands it sends, and how their reads go (the
    answers to `AdapterReadCommand`, in turn)."""

    world_size = 2

    def __init__(self, read_states: list[float]):
        self.read_states, self.sent, self.failure = read_states, [], None

    def send(self, command) -> None:
        self.sent.append(type(command).__name__)

    def minimum(self, values: list[float]) -> list[float]:
        return [min(values[0], self.read_states.pop(0))]

    def fail(self, reason: str) -> None:
        self.failure = reason


def test_rank_0_installs_an_adapter_once_every_rank_read_it_and_refuses_one_a_rank_could_not_read(adapted):
    from superinfer.shard.cli import build_executor

    root, _, _ = adapted
    executor = build_executor(_shard_config(root / "base", {}))
    executor.group = _Followers([0.0, 0.0, 1.0])
    executor.load_adapter("qv", str(root / "qv"), 3, poll_s=0)
    assert executor.group.sent == ["ReadAdapterCommand", *["AdapterReadCommand"] * 3, "LoadAdapterCommand"]
    assert _adapters(executor) == [("qv", 3)]
    executor.group = _Followers([0.0, -1.0])
    with pytest.raises(AdapterRequestError, match="LoRA adapter 'all': a tensor-parallel rank could not read"):
        executor.load_adapter("all", str(root / "all"), 4, poll_s=0)
    assert executor.group.sent == ["ReadAdapterCommand", "AdapterReadCommand", "AdapterReadCommand",
                                   "DropAdapterReadCommand"]
    assert _adapters(executor) == [("qv", 3)] and executor.group.failure is None
    executor.group = None
    executor.close()


def test_a_follower_installs_and_removes_its_share_of_the_adapters_rank_0_names(adapted):
    from superinfer.shard.cli import build_executor
    from superinfer.shard.follower import follow
    from superinfer.shard.rank_commands import (AdapterReadCommand, LoadAdapterCommand, ReadAdapterCommand,
                                                StopCommand, UnloadAdapterCommand)

    root, _, _ = adapted
    executor = build_executor(_shard_config(root / "base", {}))
    group = _PollingCommands(executor, [
        ReadAdapterCommand("qv", str(root / "qv"), 3, directory=str(root / "not-on-this-node")),  # read from source
        ReadAdapterCommand("all", "org/all", 4, directory=str(root / "all")),  # rank 0's directory, seen here
        AdapterReadCommand(3), AdapterReadCommand(4), LoadAdapterCommand("qv", 3), LoadAdapterCommand("all", 4),
        UnloadAdapterCommand(3), StopCommand()])
    assert follow(executor, group) == 0 and group.failure is None
    assert group.answers == [1.0, 1.0]
    assert group.seen[4:] == [([], set()), ([("qv", 3)], {3}), ([("qv", 3), ("all", 4)], {3, 4}), ([("all", 4)], {4})]
    # A command this rank cannot carry out ends it: the ranks would be out of step.
    group = _Commands(executor, [LoadAdapterCommand("gone", 5)])
    assert follow(executor, group) == 1 and "LoRA adapter 'gone': this rank read nothing for slot 5" in group.failure
    executor.close()
