"""Runs the model: one forward pass per step over a mix of prefill chunks and decodes,
reading and writing K/V through the paged cache. Owns the model and (after Warmup) the cache."""
from dataclasses import replace

import torch

from ..models import row_padding
from ..models.config import ModelConfig
from ..models.decoder import Linear
from ..models.lora import lora_batch
from .attention_backends import AttentionBackend, select_attention_backend
from .batch import BatchLayout, Chunk, StepBatch
from .decode_graphs import DecodeGraphs, feed_inputs
from .kv_cache import KVCache, KVGeometry
from .loader import LoadedModel


class ModelRunner:
    def __init__(self, loaded: LoadedModel, device: torch.device, dtype: torch.dtype, block_size: int,
                 attention_backend: str | None = None):
        if block_size < 1:
            raise ValueError(f"block size must be positive, got {block_size}")
        self.loaded = loaded
        self.model = loaded.model
        self.device = device
        self.dtype = dtype
        config = loaded.model.config
        # Under tensor parallelism this rank's heads: its KV blocks hold its KV heads only.
        part = loaded.partition
        num_heads = config.num_heads if part is None else part.num_heads
        num_kv_heads = config.num_kv_heads if part is None else part.num_kv_heads
        self.geometry = KVGeometry(config.num_layers, block_size, num_kv_heads, config.head_dim, dtype)
        self.cache: KVCache | None = None
        # Decode steps replayed from CUDA graphs (`capture_decode_graphs`); None: every step eager.
        self.graphs: DecodeGraphs | None = None
        self.layout = BatchLayout(
            block_size, config.num_layers, num_kv_heads, num_heads // num_kv_heads,
            config.head_dim, dtype, config.sliding_window, self.model.layer_windows,
        )
        # None: the device's default (`attention_backends`).
        self.attention: AttentionBackend = select_attention_backend(attention_backend, self.layout, device)
        # The row count the projections compute each count of rows with (`row_padding`; set
        # by `pad_rows` at warm-up); empty: as they come.
        self.row_padding: tuple[int, ...] = ()

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def block_size(self) -> int:
        return self.geometry.block_size

    def allocate(self, num_device_blocks: int, num_host_blocks: int, padding_block: bool = False) -> KVCache:
        """`padding_block`: one device block more, for the decode graphs' padding rows."""
        self.cache = None  # release a previous pool before allocating the next
        self.graphs = None  # they hold the previous pool's address
        self.cache = KVCache(self.geometry, num_device_blocks, num_host_blocks, self.device, padding_block)
        return self.cache

    def capture_decode_graphs(self, batch_sizes: tuple[int, ...]) -> DecodeGraphs:
        """Captures decode graphs over the allocated cache (allocated with its padding block):
        afterwards, decode-only steps that fit a bucket replay a graph (eagerly on the CPU)."""
        graphs = DecodeGraphs(self, batch_sizes, self.config.max_position_embeddings)
        graphs.capture_all()
        self.graphs = graphs
        return graphs

    @torch.inference_mode()
    def forward(self, chunks: list[Chunk], cache: torch.Tensor | None = None, feed=None) -> tuple[torch.Tensor, StepBatch]:
        """Computes every chunk's K/V into the cache; returns final hidden states [T, hidden]
        (rows ordered as `StepBatch.first_rows` says) and the batch. `feed`: (chunk indices,
        a device tensor of token ids, its rows) — those chunks' last input is taken from the
        tensor (a token sampled on the device by the step before), not from the chunk."""
        kv = cache if cache is not None else self._device_cache()
        # Steps with LoRA rows run eagerly: the decode graphs are captured without adapters
        # (which may be loaded after the capture).
        adapted = any(chunk.adapter for chunk in chunks)
        if cache is None and self.graphs is not None and not adapted and self.graphs.fits(chunks):
            return self.graphs.run(chunks, feed)
        batch = self.attention.build_batch(chunks)
        if adapted:
            spans = [(batch.first_rows[i], len(chunk.token_ids), chunk.adapter) for i, chunk in enumerate(chunks)]
            batch = replace(batch, meta=replace(batch.meta, lora=lora_batch(spans, self.device)))
        if feed is not None:
            fed_chunks, source, source_rows = feed
            rows = [batch.first_rows[index] + len(chunks[index].token_ids) - 1 for index in fed_chunks]
            feed_inputs(batch.input_ids, rows, source, source_rows)
        return self.model(batch.input_ids, kv, batch.meta), batch
    @torch.inference_mode()
    def logits(self, hidden_rows: torch.Tensor) -> torch.Tensor | None:
        """[R, hidden] -> [R, vocab] float32 (under tensor parallelism: on rank 0; None on the
        other ranks, which take part in the gather)."""
        return self.model.compute_logits(hidden_rows)

    def pad_rows(self) -> tuple[int, ...]:
        """Measures the LM head's cost by row count and from now on pads the rows of every
        projection by it (`row_padding`; on the CPU without tensor parallelism only). Returns
        the padding table."""
        self.set_row_padding(())
        if self.loaded.partition is None:
            self.set_row_padding(row_padding.measure(self.model.lm_head, self.config.hidden_size, self.dtype,
                                                     self.device))
        return self.row_padding

    def set_row_padding(self, table: tuple[int, ...]) -> None:
        """Every projection computes its rows by `table` (`row_padding.plan`; (): as they come)."""
        for module in self.model.modules():
            if type(module) is Linear:
                module.row_padding = table
        self.row_padding = table

    def _device_cache(self) -> torch.Tensor:
        if self.cache is None:
            raise RuntimeError("the KV cache is not allocated (Warmup first)")
        return self.cache.device
