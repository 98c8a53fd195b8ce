from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_id", "architecture", "dtype", "device_type", "block_size", "num_layers", "num_kv_heads", "head_dim", "block_bytes", "max_position_embeddings", "vocab_size", "tokenizer_json", "chat_template", "eos_token_ids", "bos_token", "eos_token", "world_size", "adapters", "adapter_slots")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_POSITION_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_JSON_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_SLOTS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    architecture: str
    dtype: str
    device_type: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_bytes: int
    max_position_embeddings: int
    vocab_size: int
    tokenizer_json: str
    chat_template: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bos_token: str
    eos_token: str
    world_size: int
    adapters: _containers.RepeatedScalarFieldContainer[str]
    adapter_slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model_id: _Optional[str] = ..., architecture: _Optional[str] = ..., dtype: _Optional[str] = ..., device_type: _Optional[str] = ..., block_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., block_bytes: _Optional[int] = ..., max_position_embeddings: _Optional[int] = ..., vocab_size: _Optional[int] = ..., tokenizer_json: _Optional[str] = ..., chat_template: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., bos_token: _Optional[str] = ..., eos_token: _Optional[str] = ..., world_size: _Optional[int] = ..., adapters: _Optional[_Iterable[str]] = ..., adapter_slots: _Optional[_Iterable[int]] = ...) -> None: ...

class LoadAdapterRequest(_message.Message):
    __slots__ = ("adapter_id", "source", "slot")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    source: str
    slot: int
    def __init__(self, adapter_id: _Optional[str] = ..., source: _Optional[str] = ..., slot: _Optional[int] = ...) -> None: ...

class LoadAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnloadAdapterRequest(_message.Message):
    __slots__ = ("slot",)
    SLOT_FIELD_NUMBER: _ClassVar[int]
    slot: int
    def __init__(self, slot: _Optional[int] = ...) -> None: ...

class UnloadAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WarmupRequest(_message.Message):
    __slots__ = ("max_batch_tokens", "max_batch_requests")
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    max_batch_tokens: int
    max_batch_requests: int
    def __init__(self, max_batch_tokens: _Optional[int] = ..., max_batch_requests: _Optional[int] = ...) -> None: ...

class CostModel(_message.Message):
    __slots__ = ("step_base_s", "per_prefill_token_s", "per_decode_request_s", "per_context_token_s", "swap_out_bytes_per_s", "swap_in_bytes_per_s", "transfer_overhead_s", "duplex", "token_curve")
    STEP_BASE_S_FIELD_NUMBER: _ClassVar[int]
    PER_PREFILL_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    PER_DECODE_REQUEST_S_FIELD_NUMBER: _ClassVar[int]
    PER_CONTEXT_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    SWAP_OUT_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    SWAP_IN_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_OVERHEAD_S_FIELD_NUMBER: _ClassVar[int]
    DUPLEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_CURVE_FIELD_NUMBER: _ClassVar[int]
    step_base_s: float
    per_prefill_token_s: float
    per_decode_request_s: float
    per_context_token_s: float
    swap_out_bytes_per_s: float
    swap_in_bytes_per_s: float
    transfer_overhead_s: float
    duplex: bool
    token_curve: TokenCurve
    def __init__(self, step_base_s: _Optional[float] = ..., per_prefill_token_s: _Optional[float] = ..., per_decode_request_s: _Optional[float] = ..., per_context_token_s: _Optional[float] = ..., swap_out_bytes_per_s: _Optional[float] = ..., swap_in_bytes_per_s: _Optional[float] = ..., transfer_overhead_s: _Optional[float] = ..., duplex: _Optional[bool] = ..., token_curve: _Optional[_Union[TokenCurve, _Mapping]] = ...) -> None: ...

class TokenCurve(_message.Message):
    __slots__ = ("tokens_s", "decodes_s", "per_context_token_s")
    TOKENS_S_FIELD_NUMBER: _ClassVar[int]
    DECODES_S_FIELD_NUMBER: _ClassVar[int]
    PER_CONTEXT_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    tokens_s: _containers.RepeatedScalarFieldContainer[float]
    decodes_s: _containers.RepeatedScalarFieldContainer[float]
    per_context_token_s: float
    def __init__(self, tokens_s: _Optional[_Iterable[float]] = ..., decodes_s: _Optional[_Iterable[float]] = ..., per_context_token_s: _Optional[float] = ...) -> None: ...

class WarmupResponse(_message.Message):
    __slots__ = ("num_device_blocks", "num_host_blocks", "cost_model")
    NUM_DEVICE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    COST_MODEL_FIELD_NUMBER: _ClassVar[int]
    num_device_blocks: int
    num_host_blocks: int
    cost_model: CostModel
    def __init__(self, num_device_blocks: _Optional[int] = ..., num_host_blocks: _Optional[int] = ..., cost_model: _Optional[_Union[CostModel, _Mapping]] = ...) -> None: ...

class SamplingParameters(_message.Message):
    __slots__ = ("do_sample", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "frequency_penalty", "seed", "top_n_tokens", "logit_bias", "min_tokens", "end_token_ids", "min_p", "presence_penalty", "allowed_token_ids", "bad_words")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    DO_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TYPICAL_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TOP_N_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    END_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    typical_p: float
    repetition_penalty: float
    frequency_penalty: float
    seed: int
    top_n_tokens: int
    logit_bias: _containers.ScalarMap[int, float]
    min_tokens: int
    end_token_ids: _containers.RepeatedScalarFieldContainer[int]
    min_p: float
    presence_penalty: float
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bad_words: _containers.RepeatedCompositeFieldContainer[TokenSequence]
    def __init__(self, do_sample: _Optional[bool] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., typical_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., top_n_tokens: _Optional[int] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., min_tokens: _Optional[int] = ..., end_token_ids: _Optional[_Iterable[int]] = ..., min_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ..., bad_words: _Optional[_Iterable[_Union[TokenSequence, _Mapping]]] = ...) -> None: ...

class TokenSequence(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class NewRequest(_message.Message):
    __slots__ = ("id", "prompt_token_ids", "parameters", "prompt_logprobs", "adapter_id", "prompt_top_n", "adapter_slot")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOP_N_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_SLOT_FIELD_NUMBER: _ClassVar[int]
    id: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    parameters: SamplingParameters
    prompt_logprobs: bool
    adapter_id: str
    prompt_top_n: int
    adapter_slot: int
    def __init__(self, id: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., parameters: _Optional[_Union[SamplingParameters, _Mapping]] = ..., prompt_logprobs: _Optional[bool] = ..., adapter_id: _Optional[str] = ..., prompt_top_n: _Optional[int] = ..., adapter_slot: _Optional[int] = ...) -> None: ...

class ScheduledRequest(_message.Message):
    __slots__ = ("id", "num_computed_tokens", "num_new_tokens", "block_table", "sample", "allowed_tokens", "input_from_shard")
    ID_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TABLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INPUT_FROM_SHARD_FIELD_NUMBER: _ClassVar[int]
    id: int
    num_computed_tokens: int
    num_new_tokens: int
    block_table: _containers.RepeatedScalarFieldContainer[int]
    sample: bool
    allowed_tokens: bytes
    input_from_shard: bool
    def __init__(self, id: _Optional[int] = ..., num_computed_tokens: _Optional[int] = ..., num_new_tokens: _Optional[int] = ..., block_table: _Optional[_Iterable[int]] = ..., sample: _Optional[bool] = ..., allowed_tokens: _Optional[bytes] = ..., input_from_shard: _Optional[bool] = ...) -> None: ...

class Transfer(_message.Message):
    __slots__ = ("id", "src_blocks", "dst_blocks")
    ID_FIELD_NUMBER: _ClassVar[int]
    SRC_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    id: int
    src_blocks: _containers.RepeatedScalarFieldContainer[int]
    dst_blocks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[int] = ..., src_blocks: _Optional[_Iterable[int]] = ..., dst_blocks: _Optional[_Iterable[int]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("step_id", "forget", "new_requests", "rotate_out", "rotate_in", "scheduled", "previous_step_id")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    FORGET_FIELD_NUMBER: _ClassVar[int]
    NEW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ROTATE_OUT_FIELD_NUMBER: _ClassVar[int]
    ROTATE_IN_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    forget: _containers.RepeatedScalarFieldContainer[int]
    new_requests: _containers.RepeatedCompositeFieldContainer[NewRequest]
    rotate_out: _containers.RepeatedCompositeFieldContainer[Transfer]
    rotate_in: _containers.RepeatedCompositeFieldContainer[Transfer]
    scheduled: _containers.RepeatedCompositeFieldContainer[ScheduledRequest]
    previous_step_id: int
    def __init__(self, step_id: _Optional[int] = ..., forget: _Optional[_Iterable[int]] = ..., new_requests: _Optional[_Iterable[_Union[NewRequest, _Mapping]]] = ..., rotate_out: _Optional[_Iterable[_Union[Transfer, _Mapping]]] = ..., rotate_in: _Optional[_Iterable[_Union[Transfer, _Mapping]]] = ..., scheduled: _Optional[_Iterable[_Union[ScheduledRequest, _Mapping]]] = ..., previous_step_id: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("id", "logprob")
    ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    id: int
    logprob: float
    def __init__(self, id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class TopTokens(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, tokens: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class SampledToken(_message.Message):
    __slots__ = ("id", "logprob", "top_tokens")
    ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    id: int
    logprob: float
    top_tokens: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, id: _Optional[int] = ..., logprob: _Optional[float] = ..., top_tokens: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class RequestOutput(_message.Message):
    __slots__ = ("request_id", "token", "prompt_logprobs", "prompt_top_tokens", "prompt_ranks", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_RANKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    token: SampledToken
    prompt_logprobs: _containers.RepeatedScalarFieldContainer[float]
    prompt_top_tokens: _containers.RepeatedCompositeFieldContainer[TopTokens]
    prompt_ranks: _containers.RepeatedScalarFieldContainer[int]
    error: str
    def __init__(self, request_id: _Optional[int] = ..., token: _Optional[_Union[SampledToken, _Mapping]] = ..., prompt_logprobs: _Optional[_Iterable[float]] = ..., prompt_top_tokens: _Optional[_Iterable[_Union[TopTokens, _Mapping]]] = ..., prompt_ranks: _Optional[_Iterable[int]] = ..., error: _Optional[str] = ...) -> None: ...

class StepTimings(_message.Message):
    __slots__ = ("forward_ns", "sampling_ns", "transfer_ns", "total_ns")
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_NS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_NS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    forward_ns: int
    sampling_ns: int
    transfer_ns: int
    total_ns: int
    def __init__(self, forward_ns: _Optional[int] = ..., sampling_ns: _Optional[int] = ..., transfer_ns: _Optional[int] = ..., total_ns: _Optional[int] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("step_id", "outputs", "completed_transfers", "timings")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    outputs: _containers.RepeatedCompositeFieldContainer[RequestOutput]
    completed_transfers: _containers.RepeatedScalarFieldContainer[int]
    timings: StepTimings
    def __init__(self, step_id: _Optional[int] = ..., outputs: _Optional[_Iterable[_Union[RequestOutput, _Mapping]]] = ..., completed_transfers: _Optional[_Iterable[int]] = ..., timings: _Optional[_Union[StepTimings, _Mapping]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("dropped_requests",)
    DROPPED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    dropped_requests: int
    def __init__(self, dropped_requests: _Optional[int] = ...) -> None: ...
