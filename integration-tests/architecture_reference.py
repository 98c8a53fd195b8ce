"""Run with the server's environment (it has torch, transformers and PEFT), not the clients':
`python architecture_reference.py build DIR MODEL_TYPE OVERRIDES_JSON` writes a random
checkpoint (the shard tests' builder); `... adapter DIR BASE SEED LORA_CONFIG_JSON` a random
PEFT LoRA adapter of that checkpoint (the LoRA tests' builder); `... greedy DIR STEPS [ADAPTER]`
reads prompts (lists of token ids, JSON on stdin) and prints, per prompt, transformers' greedy
(`generate`) continuation — through PEFT with ADAPTER — and at each step the log-probability gap
between its top two candidates."""
import json
import pathlib
import sys

import torch

REPO = pathlib.Path(__file__).resolve().parent.parent


def build(directory: str, model_type: str, overrides: str) -> None:
    sys.path.insert(0, str(REPO / "server" / "tests"))
    from conftest import build_tiny_model

    build_tiny_model(pathlib.Path(directory), model_type, seed=5, **json.loads(overrides))


def adapter(directory: str, base: str, seed: str, lora_config: str) -> None:
    sys.path.insert(0, str(REPO / "server" / "tests"))
    from test_lora import make_adapter
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    make_adapter(model, pathlib.Path(directory), int(seed), **json.loads(lora_config))


def greedy(directory: str, steps: str, adapter_directory: str | None = None) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    if adapter_directory is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_directory).eval()
    # Every step counts, as with the server's ignore_eos: no token ends a continuation early.
    model.generation_config.eos_token_id = None
    answers = []
    with torch.inference_mode():
        for prompt in json.load(sys.stdin):
            out = model.generate(torch.tensor([prompt]), max_new_tokens=int(steps), do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            top = torch.stack(out.logits)[:, 0].float().log_softmax(-1).topk(2).values  # [steps, 2]
            answers.append({"tokens": out.sequences[0, len(prompt):].tolist(),
                            "gaps": (top[:, 0] - top[:, 1]).tolist()})
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    {"build": build, "adapter": adapter, "greedy": greedy}[sys.argv[1]](*sys.argv[2:])
