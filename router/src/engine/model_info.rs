//! Facts about the served model and its KV pools, learned from the shard at start-up
//! (`Info` + `Warmup`); the HTTP layer builds its tokenizer and chat template from them.
use crate::pb;

#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub model_id: String,
    pub architecture: String,
    pub dtype: String,
    pub device_type: String,
    /// The Hugging Face `tokenizer.json`, verbatim.
    pub tokenizer_json: String,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub eos_token_ids: Vec<u32>,
    pub max_position_embeddings: u32,
    pub vocab_size: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    pub num_device_blocks: u32,
    pub num_host_blocks: u32,
    pub world_size: u32,
    /// The LoRA adapters the shard loaded at start (`--lora-adapters`) and their slots; the
    /// engine's `AdapterRegistry` serves them, and those loaded later.
    pub adapters: Vec<(String, u64)>,
}

impl ModelInfo {
    pub fn from_shard(info: &pb::InfoResponse, warmup: &pb::WarmupResponse) -> Self {
        let non_empty = |text: &str| (!text.is_empty()).then(|| text.to_string());
        Self {
            model_id: info.model_id.clone(),
            architecture: info.architecture.clone(),
            dtype: info.dtype.clone(),
            device_type: info.device_type.clone(),
            tokenizer_json: info.tokenizer_json.clone(),
            chat_template: non_empty(&info.chat_template),
            bos_token: non_empty(&info.bos_token),
            eos_token: non_empty(&info.eos_token),
            eos_token_ids: info.eos_token_ids.clone(),
            max_position_embeddings: info.max_position_embeddings,
            vocab_size: info.vocab_size,
            block_size: info.block_size,
            num_device_blocks: warmup.num_device_blocks,
            num_host_blocks: warmup.num_host_blocks,
            world_size: info.world_size.max(1),
            adapters: startup_adapters(info),
        }
    }

    /// Longest sequence (prompt + generated tokens) the device pool can hold at all.
    pub fn max_sequence_tokens(&self) -> u32 {
        self.num_device_blocks.saturating_mul(self.block_size).min(self.max_position_embeddings)
    }
}

/// The shard's adapters and their slots; a shard that gives no slots numbers them from 1.
fn startup_adapters(info: &pb::InfoResponse) -> Vec<(String, u64)> {
    let slots = info.adapter_slots.iter().copied().chain((info.adapter_slots.len() as u64 + 1)..);
    info.adapters.iter().cloned().zip(slots).collect()
}
