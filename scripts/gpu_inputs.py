"""The inputs of the GPU run, made on the spot since nothing can be downloaded there: a
random-weight Llama-shaped model (Llama-3.2-1B's or Llama-3-8B's shapes, or a tiny one for the
CPU) with a word-level tokenizer whose tokens are the words t0, t1, …, and prompts for
`superinfer bench --sharegpt` written in those words (one word, one token).

    python scripts/gpu_inputs.py DIR {tiny,1b,8b} PROMPTS_FILE"""
import argparse
import json
import pathlib
import random
import sys

SHAPES = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False),
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096, tie_word_embeddings=True),
    "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096, tie_word_embeddings=False),
}


def write_model(target: pathlib.Path, shape: str) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = transformers.LlamaConfig(rope_theta=500000.0, bos_token_id=1, eos_token_id=2, **SHAPES[shape])
    torch.manual_seed(0)
    # Built on the GPU where there is one (initialising 8B parameters on the CPU takes minutes),
    # in bf16 from the start (in float32 first, 8B would take 32 GB).
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.LlamaForCausalLM(config)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(config.vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({"bos_token": "t1", "eos_token": "t2"}))
    print(f"random {shape} model written to {target}")


def write_prompts(target: pathlib.Path, vocab: int, count: int = 256, words: int = 1200) -> None:
    """ShareGPT's layout (a human turn answered by the model) with random words from the
    model's vocabulary, past its special tokens; the bench cuts prompts of each length from them."""
    rng = random.Random(0)

    def text(length: int) -> str:
        return " ".join(f"t{rng.randrange(10, vocab)}" for _ in range(length))

    conversations = [{"conversations": [{"from": "human", "value": text(words)}, {"from": "gpt", "value": text(64)}]}
                     for _ in range(count)]
    target.write_text(json.dumps(conversations))
    print(f"{count} prompts of {words} words written to {target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=pathlib.Path, help="the model's directory")
    parser.add_argument("shape", choices=SHAPES)
    parser.add_argument("prompts", type=pathlib.Path, help="the ShareGPT-style JSON file to write")
    args = parser.parse_args(argv)
    write_model(args.directory, args.shape)
    write_prompts(args.prompts, SHAPES[args.shape]["vocab_size"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
