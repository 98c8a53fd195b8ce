"""LoRA adapters through the HTTP API: a random Llama served with two random PEFT adapters
(`--lora-adapters`, made with PEFT itself) gives, for concurrent requests naming the base
model, one adapter or the other (TGI's `adapter_id`, OpenAI's `model`) — which run in the same
batches — transformers + PEFT's greedy continuations; an adapter not loaded is a 422 and
`/v1/models` lists the adapters."""
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import REPO, SUPERINFER, launch
from test_architectures import NEAR_TIE_LOGPROB, PYTHON, REFERENCE

STEPS = 16
PROMPTS = [" ".join(f"t{(13 * i + 5 * j) % 500 + 3}" for j in range(8 + 3 * i)) for i in range(6)]
ADAPTERS = {
    "sql": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    "chat": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                          "up_proj", "down_proj"]},
}


def run(*args: str, stdin: str | None = None) -> str:
    return subprocess.run([str(PYTHON), str(REFERENCE), *args], cwd=REPO, input=stdin, check=True,
                          capture_output=True, text=True, timeout=600).stdout


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    run("build", str(root / "base"), "llama", "{}")
    for seed, (name, config) in enumerate(ADAPTERS.items()):
        run("adapter", str(root / name), str(root / "base"), str(seed + 1), json.dumps(config))
    return root


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    adapters = ",".join(f"{name}={models / name}" for name in ADAPTERS)
    args = ["--model-id", str(models / "base"), "--lora-adapters", adapters, "--device-kv-blocks", "64",
            "--host-kv-blocks", "64", "--max-batch-tokens", "512"]
    with launch(tmp_path_factory.mktemp("lora-server"), args) as instance:
        yield instance


def generate(url: str, text: str, adapter: str | None) -> dict:
    parameters = {"max_new_tokens": STEPS, "details": True, "decoder_input_details": True, "ignore_eos": True,
                  "adapter_id": adapter}
    response = requests.post(f"{url}/generate", json={"inputs": text, "parameters": parameters}, timeout=600)
    response.raise_for_status()
    return response.json()["details"]


def assert_peft_greedy(models, adapter: str | None, served: list[dict]) -> None:
    """`served` (generations' details) are transformers + PEFT's greedy continuations of their
    prompts under `adapter` (a directory of `models`; None: the base model), but for near ties."""
    prompts = [[token["id"] for token in details["prefill"]] for details in served]
    extra = [] if adapter is None else [str(models / adapter)]
    reference = json.loads(run("greedy", str(models / "base"), str(STEPS), *extra, stdin=json.dumps(prompts)))
    for want, got in zip(reference, served):
        got_ids = [token["id"] for token in got["tokens"]]
        if got_ids != want["tokens"]:
            position = next(p for p, (a, b) in enumerate(zip(want["tokens"], got_ids)) if a != b)
            assert want["gaps"][position] < NEAR_TIE_LOGPROB, (adapter, want["tokens"], got_ids)


def test_mixed_concurrent_requests_get_their_adapters_greedy_tokens(models, server):
    # Every prompt under the base model and under each adapter, all at once.
    jobs = [(text, adapter) for text in PROMPTS for adapter in (None, *ADAPTERS)]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        served = list(pool.map(lambda job: generate(server.url, *job), jobs))
    for adapter in (None, *ADAPTERS):
        assert_peft_greedy(models, adapter, [details for (_, name), details in zip(jobs, served) if name == adapter])
    # The adapters change the output: a test of adapters that did nothing would pass above.
    by_adapter = {name: [d["tokens"][0]["id"] for (_, n), d in zip(jobs, served) if n == name]
                  for name in (None, *ADAPTERS)}
    assert by_adapter[None] != by_adapter["sql"] and by_adapter[None] != by_adapter["chat"]


def test_openai_model_names_an_adapter_and_models_lists_them(server):
    status, text = server.get("/v1/models")
    assert status == 200
    assert [card["id"] for card in json.loads(text)["data"]][1:] == list(ADAPTERS)

    def completion(model: str) -> str:
        body = {"model": model, "prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0}
        return requests.post(f"{server.url}/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]

    def tgi(adapter: str | None) -> str:
        body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 6, "adapter_id": adapter}}
        return requests.post(f"{server.url}/generate", json=body, timeout=120).json()["generated_text"]

    assert completion("chat") == tgi("chat") != tgi(None)
    # Any other name a client library sends is the base model.
    assert completion("whatever-the-client-sends") == tgi(None)


def test_an_adapter_not_loaded_is_422(server):
    response = requests.post(f"{server.url}/generate", json={"inputs": "t5 t6", "parameters": {"adapter_id": "absent"}},
                             timeout=60)
    assert response.status_code == 422
    assert response.json()["error"] == ("Input validation error: adapter `absent` is not loaded; "
                                        "loaded adapters: sql, chat")


@pytest.fixture(scope="module")
def runtime_server(models, tmp_path_factory):
    # vLLM's switch, as its users set it; "chat" loaded at start, the rest at run time.
    args = ["--model-id", str(models / "base"), "--lora-adapters", f"chat={models / 'chat'}", "--device-kv-blocks",
            "64", "--host-kv-blocks", "64", "--max-batch-tokens", "512"]
    with launch(tmp_path_factory.mktemp("lora-runtime"), args, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as instance:
        yield instance


def test_adapters_loaded_replaced_and_unloaded_at_run_time(models, runtime_server, tmp_path):
    url = runtime_server.url

    def post(path: str, body: dict) -> requests.Response:
        return requests.post(f"{url}{path}", json=body, timeout=600)

    def served_ids() -> list[str]:
        return [card["id"] for card in requests.get(f"{url}/v1/models", timeout=60).json()["data"]][1:]

    response = post("/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(models / "sql")})
    assert (response.status_code, response.text) == (200, "Success: LoRA adapter 'sql' added successfully.")
    assert served_ids() == ["chat", "sql"]
    # Loaded while serving, it runs beside the base model and the startup adapter, with PEFT's tokens.
    jobs = [(text, adapter) for text in PROMPTS for adapter in (None, "sql", "chat")]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        served = list(pool.map(lambda job: generate(url, *job), jobs))
    by_adapter = {name: [d for (_, n), d in zip(jobs, served) if n == name] for name in (None, "sql", "chat")}
    assert_peft_greedy(models, "sql", by_adapter["sql"])
    assert_peft_greedy(models, None, by_adapter[None])
    tokens = {name: [[t["id"] for t in d["tokens"]] for d in details] for name, details in by_adapter.items()}
    assert tokens["sql"] != tokens[None] and tokens["chat"] != tokens["sql"]

    # What the shard cannot serve is a 400 with the reason, and nothing changes.
    broken = tmp_path / "not-an-adapter"
    broken.mkdir()
    response = post("/v1/load_lora_adapter", {"lora_name": "broken", "lora_path": str(broken)})
    assert response.status_code == 400, response.text
    assert "adapter_config.json" in response.json()["error"]
    assert post("/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(models / "sql")}).status_code == 400
    assert served_ids() == ["chat", "sql"]

    # "chat" replaced in place by the sql weights: its requests now give sql's tokens.
    response = post("/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": str(models / "sql"), "load_inplace": True})
    assert response.status_code == 200, response.text
    replaced = [generate(url, text, "chat") for text in PROMPTS]
    assert [[t["id"] for t in d["tokens"]] for d in replaced] == tokens["sql"]

    response = post("/v1/unload_lora_adapter", {"lora_name": "sql"})
    assert (response.status_code, response.text) == (200, "Success: LoRA adapter 'sql' removed successfully.")
    assert served_ids() == ["chat"]
    response = requests.post(f"{url}/generate", json={"inputs": PROMPTS[0], "parameters": {"adapter_id": "sql"}},
                             timeout=60)
    assert response.status_code == 422
    assert post("/v1/unload_lora_adapter", {"lora_name": "sql"}).status_code == 404
    # The base model is unchanged by it all.
    assert [[t["id"] for t in generate(url, text, None)["tokens"]] for text in PROMPTS] == tokens[None]


@pytest.fixture(scope="module")
def resolver_server(models, tmp_path_factory):
    # vLLM's variable, as its users set it: the adapters' directory (here also the base model's,
    # which holds no adapter_config.json). No adapter is loaded at start, and one at a time is
    # served (`--max-loras 1`).
    args = ["--model-id", str(models / "base"), "--device-kv-blocks", "64", "--host-kv-blocks", "64",
            "--max-batch-tokens", "512", "--max-loras", "1"]
    with launch(tmp_path_factory.mktemp("lora-resolver"), args,
                env={"VLLM_LORA_RESOLVER_CACHE_DIR": str(models)}) as instance:
        yield instance


def test_an_adapter_a_request_names_is_loaded_from_the_resolver_dir(models, resolver_server):
    url = resolver_server.url

    def served_ids() -> list[str]:
        return [card["id"] for card in requests.get(f"{url}/v1/models", timeout=60).json()["data"]][1:]

    assert served_ids() == []
    # Every prompt naming "sql" at once, before it is loaded: loaded once, PEFT's greedy tokens.
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        served = list(pool.map(lambda text: generate(url, text, "sql"), PROMPTS))
    assert_peft_greedy(models, "sql", served)
    assert served_ids() == ["sql"]
    # OpenAI's `model` names "chat": loaded in the place of "sql" (idle), and its tokens are the
    # TGI route's with it.
    completion = requests.post(f"{url}/v1/completions", json={"model": "chat", "prompt": PROMPTS[0], "max_tokens": 4,
                                                              "temperature": 0}, timeout=600)
    assert completion.status_code == 200, completion.text
    assert served_ids() == ["chat"]
    tgi = requests.post(f"{url}/generate", json={"inputs": PROMPTS[0], "parameters": {
        "max_new_tokens": 4, "adapter_id": "chat"}}, timeout=600).json()["generated_text"]
    assert completion.json()["choices"][0]["text"] == tgi
    # A directory without an adapter_config.json, or a path out of the directory, is not loaded.
    for name in ("base", f"../{models.name}/sql"):
        response = requests.post(f"{url}/generate", json={"inputs": PROMPTS[0], "parameters": {"adapter_id": name}},
                                 timeout=60)
        assert response.status_code == 422, response.text
    assert served_ids() == ["chat"]

    # Both adapters asked for at once, one served at a time: each request waits for the other
    # adapter's requests to end, and every one gets PEFT's greedy tokens from an adapter
    # evicted and loaded again into a new slot.
    jobs = [(text, adapter) for text in PROMPTS for adapter in ("sql", "chat")]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        served = list(pool.map(lambda job: generate(url, *job), jobs))
    for adapter in ("sql", "chat"):
        assert_peft_greedy(models, adapter, [details for (_, name), details in zip(jobs, served) if name == adapter])
    assert len(served_ids()) == 1
    metrics = requests.get(f"{url}/metrics", timeout=60).text
    evictions = next(float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith("superinfer_lora_adapter_evictions_total "))
    assert evictions >= 2
