"""Model ids on the Hugging Face Hub: found in the local hub cache, or downloaded into it with
`huggingface_hub` (unless offline), with errors that say what to do. Owns no state; the cache
is huggingface_hub's own, laid out as it lays it out, so other tools share it."""
import contextlib
import json
import logging
import pathlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import LoaderError
from .progress import ProgressLog

log = logging.getLogger(__name__)

# What the loader reads (config, weights, tokenizer, generation config, chat template); a
# repository's other formats (PyTorch .bin, ONNX, GGUF, ...) are never downloaded.
MODEL_FILES = ("*.json", "*.safetensors", "*.jinja")


@dataclass(frozen=True)
class HubOptions:
    # A branch, tag or commit; None: the repository's default branch ("main").
    revision: str | None = None
    # The hub cache searched and downloaded into; None: huggingface_hub's default.
    cache: pathlib.Path | None = None
    # HF_HUB_OFFLINE: the cache only, never the network.
    offline: bool = False
    # HF_TOKEN, for private and gated models; None: huggingface_hub's stored login, if any.
    token: str | None = field(default=None, repr=False)
    # HF_ENDPOINT (a mirror); None: huggingface_hub's (https://huggingface.co).
    endpoint: str | None = None


def _is_true(value: str | None) -> bool:
    # huggingface_hub's reading of its boolean variables.
    return (value or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def options_from_environment(environ: Mapping[str, str], revision: str | None = None,
                             cache: pathlib.Path | None = None) -> HubOptions:
    """HubOptions from huggingface_hub's variables, read the way it reads them; an explicit
    `cache` (a flag) wins. For the CLI edge, which passes its environment."""
    if cache is None:
        named = environ.get("HF_HUB_CACHE") or environ.get("HUGGINGFACE_HUB_CACHE")
        if named:
            cache = pathlib.Path(named).expanduser()
        elif environ.get("HF_HOME"):
            cache = pathlib.Path(environ["HF_HOME"]).expanduser() / "hub"
    return HubOptions(
        revision=revision,
        cache=cache,
        offline=_is_true(environ.get("HF_HUB_OFFLINE") or environ.get("TRANSFORMERS_OFFLINE")),
        token=environ.get("HF_TOKEN") or environ.get("HUGGING_FACE_HUB_TOKEN") or None,
        endpoint=environ.get("HF_ENDPOINT") or None,
    )


def _cache_path(options: HubOptions) -> pathlib.Path:
    from huggingface_hub import constants

    return options.cache if options.cache is not None else pathlib.Path(constants.HF_HUB_CACHE)


def cached_revisions(model_id: str, cache: pathlib.Path) -> list[str]:
    """The revisions of `model_id` in `cache`, as `ref (commit)` or a bare commit, read with
    huggingface_hub's own cache scanner; empty when it has none (or no cache exists)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = scan_cache_dir(cache).repos
    except (CacheNotFound, OSError, ValueError):
        return []
    found = []
    for repo in repos:
        if repo.repo_id != model_id or repo.repo_type != "model":
            continue
        for revision in sorted(repo.revisions, key=lambda revision: revision.commit_hash):
            commit = revision.commit_hash[:12]
            refs = sorted(revision.refs)
            found += [f"{ref} ({commit})" for ref in refs] if refs else [commit]
    return found


def _not_cached(model_id: str, options: HubOptions) -> str:
    cache = _cache_path(options)
    revisions = cached_revisions(model_id, cache)
    if not revisions:
        return f"model {model_id!r} is not a local directory and is not in the Hugging Face cache {cache}"
    wanted = options.revision or "main"
    return (f"revision {wanted!r} of model {model_id!r} is not in the Hugging Face cache {cache}, "
            f"which has {', '.join(revisions)}")


@contextlib.contextmanager
def _explained(model_id: str, options: HubOptions, doing: str):
    """huggingface_hub's errors as LoaderErrors that say what to do."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    revision = f" (revision {options.revision!r})" if options.revision else ""
    try:
        yield
    except GatedRepoError:
        raise LoaderError(f"model {model_id!r} is gated on the Hugging Face Hub: accept its conditions on its "
                          "page and set HF_TOKEN to a token of that account") from None
    except RevisionNotFoundError:
        raise LoaderError(f"the Hugging Face Hub has no revision {options.revision!r} of model {model_id!r}") from None
    except RepositoryNotFoundError:
        raise LoaderError(f"model {model_id!r} is not a local directory, and the Hugging Face Hub has no such model "
                          "or it is private (set HF_TOKEN to a token with access)") from None
    except IncompleteSnapshotError as err:
        raise LoaderError(f"the cached copy of model {model_id!r} is incomplete and the Hugging Face Hub cannot be "
                          f"used to complete it: {err}") from None
    except LocalEntryNotFoundError as err:
        if options.offline:
            raise LoaderError(f"{_not_cached(model_id, options)}; HF_HUB_OFFLINE=1 forbids downloading it: unset "
                              "HF_HUB_OFFLINE on a machine with network access, or fill the cache first "
                              f"(`hf download {model_id}`)") from None
        cause = err.__cause__ or err
        raise LoaderError(f"{_not_cached(model_id, options)}, and the Hugging Face Hub could not be reached "
                          f"({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}); "
                          "check the network (or HF_ENDPOINT), or fill the cache first") from None
    except HFValidationError as err:
        raise LoaderError(f"model {model_id!r} is not a local directory, a .gguf file or a Hugging Face model id: "
                          f"{err}") from None
    except Exception as err:  # noqa: BLE001 — HTTP errors, a full disk, ...: the shard reports them as one
        raise LoaderError(f"{doing} model {model_id!r}{revision} failed: {type(err).__name__}: {err}") from err


def fetch_config(model_id: str, options: HubOptions) -> dict:
    """`model_id`'s config.json alone (from the cache, else downloaded into it): what the
    architecture check needs, before any weight is fetched."""
    from huggingface_hub import hf_hub_download

    with _explained(model_id, options, "fetching config.json of"):
        path = hf_hub_download(model_id, "config.json", revision=options.revision, cache_dir=options.cache,
                               token=options.token, endpoint=options.endpoint, local_files_only=options.offline)
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as err:
        raise LoaderError(f"config.json of model {model_id!r} cannot be read: {err}") from None


def snapshot(model_id: str, options: HubOptions) -> pathlib.Path:
    """The directory of `model_id`'s files: the cached snapshot, downloading what is missing
    when online (huggingface_hub asks the Hub which commit the revision is and falls back to the
    cache when the Hub cannot be reached)."""
    from huggingface_hub import snapshot_download

    revision = f" (revision {options.revision!r})" if options.revision else ""
    if not options.offline:
        log.info("fetching model %r%s from the Hugging Face Hub into %s (files already cached are kept; "
                 "HF_HUB_OFFLINE=1 uses the cache only)", model_id, revision, _cache_path(options))
    started = time.perf_counter()
    with _explained(model_id, options, "downloading"):
        directory = snapshot_download(
            model_id, revision=options.revision, cache_dir=options.cache, token=options.token,
            endpoint=options.endpoint, local_files_only=options.offline, allow_patterns=list(MODEL_FILES),
            tqdm_class=ProgressLog,
        )
    if not options.offline:
        log.info("model %r ready in %s (%.1f s)", model_id, directory, time.perf_counter() - started)
    return pathlib.Path(directory)
