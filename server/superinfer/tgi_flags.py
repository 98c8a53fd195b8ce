"""TGI's launcher flags that have no meaning here, accepted so that a command line or a
deployment written for TGI starts unchanged, each with a warning that names it and says why.

TGI's flags that do apply are names where the flag is declared: the router's in clap
(router/src/config.rs: `--max-batch-prefill-tokens`, `--max-batch-size`, `-p`, ...), the
launcher's in launch_config.py (`--model-id`, `--cuda-memory-fraction`, ...). The list follows
TGI's launcher (launcher/src/main.rs, `struct Args`)."""
import argparse
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class IgnoredFlag:
    name: str
    takes_value: bool
    why: str
    # TGI reads each flag from its name in upper case too, except --env.
    reads_variable: bool = True

    @property
    def dest(self) -> str:
        return "tgi_" + self.name.lstrip("-").replace("-", "_")

    @property
    def variable(self) -> str | None:
        return self.name.lstrip("-").replace("-", "_").upper() if self.reads_variable else None


_SHARDED = "give --num-shard N to split the model over N devices (default 1)"
_SCHEDULER = "the scheduler (--scheduler) decides when waiting requests join the batch"
_ROPE = "RoPE scaling is read from the model's config.json"
_WATERMARK = "watermarking is not supported"
_NGROK = "there is no ngrok tunnel"

IGNORED = (
    IgnoredFlag("--validation-workers", True, "the router's tokenizer work is bounded by --max-concurrent-requests"),
    IgnoredFlag("--sharded", True, _SHARDED),
    IgnoredFlag("--quantize", True, "quantizing at load is not supported; the weights load in --dtype (an FP8 checkpoint is de-quantized into it)"),
    IgnoredFlag("--speculate", True, "speculative decoding is not supported"),
    IgnoredFlag("--kv-cache-dtype", True, "the KV cache is kept in the model's dtype"),
    IgnoredFlag("--trust-remote-code", False, "models run on SuperInfer's own implementations, never a "
                "repository's code"),
    IgnoredFlag("--waiting-served-ratio", True, _SCHEDULER),
    IgnoredFlag("--max-waiting-tokens", True, _SCHEDULER),
    IgnoredFlag("--prometheus-port", True, "metrics are served on the API's port, at /metrics"),
    IgnoredFlag("--shard-uds-path", True, "the shard's socket lives in a private temporary directory"),
    IgnoredFlag("--weights-cache-override", True, "give a local directory as --model-id, or "
                "--huggingface-hub-cache"),
    IgnoredFlag("--disable-custom-kernels", False, "there are no custom kernels to disable"),
    IgnoredFlag("--rope-scaling", True, _ROPE),
    IgnoredFlag("--rope-factor", True, _ROPE),
    IgnoredFlag("--watermark-gamma", True, _WATERMARK),
    IgnoredFlag("--watermark-delta", True, _WATERMARK),
    IgnoredFlag("--ngrok", False, _NGROK),
    IgnoredFlag("--ngrok-authtoken", True, _NGROK),
    IgnoredFlag("--ngrok-edge", True, _NGROK),
    IgnoredFlag("--tokenizer-config-path", True, "the tokenizer config is read from the model's directory"),
    IgnoredFlag("--env", False, "there is no environment report", reads_variable=False),
    IgnoredFlag("--usage-stats", True, "SuperInfer sends no usage statistics"),
    IgnoredFlag("--enable-prefill-logprobs", False, "prompt logprobs (decoder_input_details) are always available"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TGI flags that do not apply here", "accepted, ignored with a warning")
    for flag in IGNORED:
        names = [flag.name, "-e"] if flag.name == "--env" else [flag.name]
        if flag.takes_value:
            group.add_argument(*names, dest=flag.dest, default=None, metavar="VALUE", help=flag.why)
        else:
            group.add_argument(*names, dest=flag.dest, action="store_true", default=None, help=flag.why)


def warnings(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, ...]:
    """One line per ignored flag given, on the command line or in its TGI variable."""
    found = []
    for flag in IGNORED:
        value = getattr(args, flag.dest, None)
        if value is not None:
            given = f"{flag.name} {value}" if flag.takes_value else flag.name
            found.append(f"TGI's {given} is ignored: {flag.why}")
        elif flag.variable is not None and environ.get(flag.variable):
            found.append(f"TGI's {flag.variable} (in the environment) is ignored: {flag.why}")
    return tuple(found)
