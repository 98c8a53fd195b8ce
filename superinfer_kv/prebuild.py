"""`python -m superinfer_kv.prebuild DIR`: compiles and links DuplexKV's CUDA extension into DIR
ahead of time (needs nvcc — the `cuda-build` extra — and a CUDA build of torch, not a GPU), so a
machine that runs it with SUPERINFER_KV_CUDA_EXTENSION=DIR/superinfer_kv_cuda.so needs no
compiler. The image's build does this."""

import argparse
import logging
from pathlib import Path

from .cuda_toolchain import PREBUILT_ENV, prebuild_cuda_extension


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m superinfer_kv.prebuild", description=__doc__)
    parser.add_argument("destination", type=Path, help="directory the linked extension is copied to")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    library = prebuild_cuda_extension(args.destination)
    print(f"built {library}; import it with {PREBUILT_ENV}={library}")


if __name__ == "__main__":
    main()
