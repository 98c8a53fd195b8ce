"""Errors the shard raises; the service maps each kind to one gRPC status."""


class LoaderError(RuntimeError):
    """The model could not be found or read (missing, corrupt or unsupported files)."""


class LoraError(LoaderError):
    """A LoRA adapter (`--lora-adapters`, or one LoadAdapter names) cannot be served with this
    model; the message names the adapter and says why."""


class AdapterRequestError(ValueError):
    """A LoadAdapter or UnloadAdapter the shard refuses (a slot in use or not loaded, an id
    loaded already, an adapter that cannot be served), nothing changed (INVALID_ARGUMENT)."""


class PlanError(ValueError):
    """A Step plan failed validation; it is rejected whole (INVALID_ARGUMENT) and no state changed."""


class NotWarmedUpError(RuntimeError):
    """Step was called before Warmup allocated the KV pools (FAILED_PRECONDITION)."""
