"""What the router needs of the tokenizer, read straight from the model directory's files
(tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json) so
that starting a shard never imports transformers."""
import json
import pathlib
from dataclasses import dataclass
from typing import Any

from .errors import LoaderError


@dataclass(frozen=True)
class TokenizerInfo:
    tokenizer_json: str
    chat_template: str
    bos_token: str
    eos_token: str
    eos_token_ids: tuple[int, ...]


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LoaderError(f"{path} is not valid JSON: {err}") from None


def _token_text(value: Any) -> str:
    # tokenizer_config.json stores special tokens as strings or serialised AddedTokens.
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value) if value is not None else ""


def _chat_template(directory: pathlib.Path, tokenizer_config: dict[str, Any]) -> str:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = tokenizer_config.get("chat_template") or ""
    if isinstance(template, list):  # named templates: the "default" one serves chat
        named = {entry.get("name"): entry.get("template", "") for entry in template}
        template = named.get("default") or next(iter(named.values()), "")
    return str(template)


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


def read_tokenizer_info(directory: pathlib.Path, config_eos_ids: tuple[int, ...]) -> TokenizerInfo:
    tokenizer_path = directory / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise LoaderError(f"{directory} has no tokenizer.json (a fast tokenizer file is required)")
    tokenizer_json = tokenizer_path.read_text()
    try:
        vocab = json.loads(tokenizer_json)
    except json.JSONDecodeError as err:
        raise LoaderError(f"{tokenizer_path} is not valid JSON: {err}") from None
    tokenizer_config = _read_json(directory / "tokenizer_config.json")
    generation_config = _read_json(directory / "generation_config.json")
    eos_token = _token_text(tokenizer_config.get("eos_token"))
    eos_ids = list(config_eos_ids) + _ids(generation_config.get("eos_token_id"))
    added = {token.get("content"): token.get("id") for token in vocab.get("added_tokens", [])}
    if eos_token in added:
        eos_ids.append(int(added[eos_token]))
    return TokenizerInfo(
        tokenizer_json=tokenizer_json,
        chat_template=_chat_template(directory, tokenizer_config),
        bos_token=_token_text(tokenizer_config.get("bos_token")),
        eos_token=eos_token,
        eos_token_ids=tuple(dict.fromkeys(eos_ids)),  # unique, first-seen order
    )
