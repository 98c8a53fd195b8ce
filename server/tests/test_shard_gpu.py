"""The shard on a GPU (skipped without one): bf16 compute, pinned host pool, the CUDA
transfer path, and a rotation round trip that continues exactly as without the rotation."""
import pytest
import torch
from conftest import make_executor
from test_shard_rotation import PROMPT, Driver, _start, leave_after_compute_round_trip, rotation_round_trip

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_gpu_pools_and_dtype(tiny_llama_dir):
    executor = make_executor(tiny_llama_dir, device="cuda")
    cache = executor.runner.cache
    assert cache.device.is_cuda and cache.device.dtype == torch.bfloat16
    assert cache.host.is_pinned()
    assert executor.info().dtype == "bfloat16" and executor.info().device_type == "cuda"


@pytest.mark.parametrize("same_step", [False, True], ids=["after-ack", "same-step"])
def test_gpu_rotation_round_trip(tiny_llama_dir, same_step):
    """With `same_step` the return's first decode runs in the step that copies it in: the compute
    stream waits for the copy's event."""
    _, tokens, expected = rotation_round_trip(tiny_llama_dir, "cuda", 4, 8, [3, 2, 1, 0], [9, 8, 7, 6], ids=(1, 2),
                                              same_step=same_step)
    assert tokens == expected


def test_gpu_leave_after_compute(tiny_llama_dir):
    """A copy out submitted after the forward: its stream waits for the compute issued before it,
    so the saved K/V includes the step's own."""
    _, tokens, expected = leave_after_compute_round_trip(tiny_llama_dir, "cuda")
    assert tokens == expected


def test_gpu_without_a_host_pool(tiny_llama_dir):
    executor = make_executor(tiny_llama_dir, device="cuda", host_blocks=0)
    assert executor.runner.cache.num_host_blocks == 0
    driver = Driver(executor)
    tokens = _start(driver, 1, [0, 1, 2, 3])
    driver.decode(1, tokens, len(PROMPT), [0, 1, 2, 3], 4)
    assert len(tokens) == 5


def test_gpu_decode_graphs_replay_the_eager_tokens(tiny_llama_dir):
    """Three requests decoding together (bucket 4: one padding row), then two (bucket 2), with
    the decode graphs captured and without: the same greedy tokens, and the graphs' padding
    block outside the pool the router is told of."""
    from superinfer.pb import shard_pb2 as pb

    prompts = {1: PROMPT, 2: list(range(100, 120)), 3: list(range(200, 207))}
    tables = {1: [0, 1, 2, 3], 2: [4, 5, 6], 3: [7, 8]}
    runs = {}
    for graphs in (None, ()):
        executor = make_executor(tiny_llama_dir, device="cuda", cuda_graphs=graphs)
        if graphs is None:
            assert executor.graphs.batch_sizes == (1, 2, 4, 8) and executor.graphs.graphs.keys() == {1, 2, 4, 8}
            assert executor.runner.cache.padding_block == executor.limits.num_device_blocks
        else:
            assert executor.graphs is None and executor.runner.cache.padding_block is None
        driver = Driver(executor)
        tokens = {rid: _start(driver, rid, tables[rid], prompt=prompts[rid]) for rid in prompts}
        for step in range(12):
            live = [rid for rid in prompts if step < 4 or rid != 3]
            reply = driver.step(scheduled=[
                pb.ScheduledRequest(id=rid, num_computed_tokens=len(prompts[rid]) + len(tokens[rid]) - 1,
                                    num_new_tokens=1, block_table=tables[rid], sample=True) for rid in live])
            for rid, output in zip(live, reply.outputs):
                tokens[rid].append(output.token.id)
        runs[graphs] = tokens
    assert runs[None] == runs[()]


def test_gpu_adapter_loaded_after_the_decode_graphs(tiny_llama_dir, tmp_path):
    """A LoRA adapter loaded at run time, after the decode graphs were captured (its install wraps
    the projections the graphs read the weights of): the base model's decodes still replay the
    graphs with the tokens they gave before the load, and the adapter's rows run eagerly with the
    tokens they give on a shard that captured no graphs."""
    from test_lora import PROMPT as LORA_PROMPT, _generate, make_adapter
    from transformers import AutoModelForCausalLM

    make_adapter(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), tmp_path / "qv", 0, r=4, lora_alpha=8,
                 target_modules=["q_proj", "v_proj"])
    prompt = LORA_PROMPT[:10]
    graphed = make_executor(tiny_llama_dir, device="cuda")
    eager = make_executor(tiny_llama_dir, device="cuda", cuda_graphs=())
    assert graphed.graphs is not None and eager.graphs is None
    base_before = _generate(graphed, 1, prompt, 0)
    # The load's memory check reads the GPU's free memory (the driver's, and the allocator's unused).
    from superinfer.shard.lora import free_memory_bytes
    free, total = free_memory_bytes(torch.device("cuda")), torch.cuda.mem_get_info()[1]
    assert 0 < free <= total, (free, total)
    tokens = {}
    for name, executor in (("graphed", graphed), ("eager", eager)):
        executor.load_adapter("qv", str(tmp_path / "qv"), 1)
        tokens[name] = _generate(executor, 2, prompt, 1, adapter_id="qv", adapter_slot=1)
    assert _generate(graphed, 3, prompt, 2) == base_before
    assert tokens["graphed"] == tokens["eager"] != base_before
    graphed.unload_adapter(1)
    assert _generate(graphed, 4, prompt, 3) == base_before
