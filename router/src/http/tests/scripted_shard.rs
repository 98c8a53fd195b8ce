//! A shard that answers the real gRPC protocol with scripted tokens: every request generates
//! the tokens of `SCRIPT` followed by EOS (then EOS again when it ignores EOS), each replaced
//! by the lowest allowed id where a grammar's mask does not allow it. It lets the
//! HTTP tests run the real router stack (client, engine, scheduler) without a model, and
//! records which requests the engine forgot and how far each had got.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;
use tonic::{Request, Response, Status};

use crate::pb;
use crate::pb::shard_server::{Shard, ShardServer};

pub(super) const EOS: u32 = 2;
pub(super) const SCRIPT: &str = "Hello world. Goodbye!";

/// What the shard saw.
/// The LoRA adapters the scripted shard says it loaded.
pub(super) const ADAPTERS: [&str; 2] = ["sql-lora", "chat-lora"];

#[derive(Default)]
pub(super) struct ShardLog {
    pub new_requests: Vec<pb::NewRequest>,
    /// (request id, tokens sampled for it) at the time it was forgotten.
    pub forgotten: Vec<(u64, usize)>,
    /// LoRA adapters installed by LoadAdapter: (id, source, slot).
    pub loaded_adapters: Vec<(String, String, u64)>,
    /// Slots removed by UnloadAdapter, in order.
    pub unloaded_slots: Vec<u64>,
}

/// A LoadAdapter source the scripted shard refuses, as the real one refuses an adapter it
/// cannot serve.
pub(super) const UNSERVABLE_ADAPTER: &str = "/adapters/not-a-peft-adapter";

struct Sequence {
    known_tokens: usize,
    prompt_tokens: usize,
    sampled: usize,
    request: pb::NewRequest,
}

pub(super) struct ScriptedShard {
    script: Vec<u32>,
    vocab_size: u32,
    tokenizer_json: String,
    chat_template: String,
    sequences: Mutex<HashMap<u64, Sequence>>,
    /// Installed adapters: slot -> id.
    adapters: Mutex<HashMap<u64, String>>,
    log: Arc<Mutex<ShardLog>>,
}

impl ScriptedShard {
    /// Serves a scripted shard on a fresh unix socket; returns the socket path and its log.
    pub(super) fn spawn(
        tokenizer_json: String,
        chat_template: String,
    ) -> (PathBuf, Arc<Mutex<ShardLog>>) {
        Self::spawn_with_script(tokenizer_json, chat_template, SCRIPT, 49152)
    }

    /// A shard whose model writes `script` (tokenized by its own tokenizer) and has
    /// `vocab_size` tokens.
    pub(super) fn spawn_with_script(
        tokenizer_json: String,
        chat_template: String,
        script: &str,
        vocab_size: u32,
    ) -> (PathBuf, Arc<Mutex<ShardLog>>) {
        let tokenizer = crate::tokenizer::Tokenizer::from_json(&tokenizer_json).unwrap();
        let mut script = tokenizer.encode(script, false).unwrap().ids;
        script.push(EOS);
        let log = Arc::new(Mutex::new(ShardLog::default()));
        let shard = ScriptedShard {
            script,
            vocab_size,
            tokenizer_json,
            chat_template,
            sequences: Mutex::new(HashMap::new()),
            adapters: Mutex::new(ADAPTERS.iter().enumerate().map(|(k, id)| (k as u64 + 1, id.to_string())).collect()),
            log: log.clone(),
        };
        let path = std::env::temp_dir().join(format!(
            "superinfer-http-test-{:016x}.sock",
            rand::random::<u64>()
        ));
        let listener = UnixListener::bind(&path).unwrap();
        let incoming = futures::stream::unfold(listener, |listener| async move {
            Some((listener.accept().await.map(|(stream, _)| stream), listener))
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ShardServer::new(shard))
                .serve_with_incoming(incoming),
        );
        (path, log)
    }

    fn output(
        &self,
        scheduled: &pb::ScheduledRequest,
        sequence: &mut Sequence,
    ) -> pb::RequestOutput {
        let end = (scheduled.num_computed_tokens + scheduled.num_new_tokens) as usize;
        let mut output = pb::RequestOutput {
            request_id: scheduled.id,
            ..Default::default()
        };
        if sequence.request.prompt_logprobs {
            let first = scheduled.num_computed_tokens as usize + 1;
            let positions = first..end.min(sequence.prompt_tokens);
            output.prompt_logprobs = positions.clone().map(|_| -1.0).collect();
            output.prompt_ranks = positions.clone().map(|position| 1 + position as u32 % 3).collect();
            let top_n = sequence
                .request
                .prompt_top_n
                .unwrap_or_else(|| sequence.request.parameters.as_ref().map_or(0, |p| p.top_n_tokens));
            if top_n > 0 {
                output.prompt_top_tokens = positions
                    .map(|_| pb::TopTokens {
                        tokens: (0..top_n).map(|rank| pb::TokenLogprob { id: 100 + rank, logprob: -0.2 * rank as f32 }).collect(),
                    })
                    .collect();
            }
        }
        if end == sequence.known_tokens {
            let id = allowed_or_lowest(&scheduled.allowed_tokens, self.script[sequence.sampled.min(self.script.len() - 1)]);
            // The seed shifts the logprobs so that best_of candidates differ: two random seeds
            // give the same value once in millions of draws (`seed % 5` tied one time in five).
            let seed = sequence.request.parameters.as_ref().map_or(0, |p| p.seed);
            let top_n = sequence
                .request
                .parameters
                .as_ref()
                .map_or(0, |p| p.top_n_tokens);
            let top_tokens = (0..top_n)
                .map(|rank| pb::TokenLogprob {
                    id: id + rank,
                    logprob: -0.1 * rank as f32,
                })
                .collect();
            output.token = Some(pb::SampledToken {
                id,
                logprob: -0.5 - (seed >> 40) as f32 / (1u64 << 24) as f32,
                top_tokens,
            });
            sequence.sampled += 1;
            sequence.known_tokens += 1;
        }
        output
    }
}

/// Under a grammar's mask: the scripted token when the mask allows it, else the lowest id it
/// allows (an empty mask allows nothing: the lowest id then, which the grammar rejects).
fn allowed_or_lowest(mask: &[u8], scripted: u32) -> u32 {
    let allowed = |id: u32| mask.get(id as usize / 8).is_some_and(|byte| byte >> (id % 8) & 1 == 1);
    if mask.is_empty() || allowed(scripted) {
        return scripted;
    }
    (0..mask.len() as u32 * 8).find(|&id| allowed(id)).unwrap_or(0)
}

#[tonic::async_trait]
impl Shard for ScriptedShard {
    async fn info(
        &self,
        _: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        Ok(Response::new(pb::InfoResponse {
            model_id: "smollm2-test".into(),
            architecture: "llama".into(),
            dtype: "float32".into(),
            device_type: "cpu".into(),
            block_size: 16,
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: 8,
            block_bytes: 1024,
            max_position_embeddings: 8192,
            vocab_size: self.vocab_size,
            tokenizer_json: self.tokenizer_json.clone(),
            chat_template: self.chat_template.clone(),
            eos_token_ids: vec![EOS],
            bos_token: "<|im_start|>".into(),
            eos_token: "<|im_end|>".into(),
            world_size: 1,
            adapters: ADAPTERS.iter().map(|adapter| adapter.to_string()).collect(),
            adapter_slots: (1..=ADAPTERS.len() as u64).collect(),
        }))
    }

    async fn load_adapter(
        &self,
        request: Request<pb::LoadAdapterRequest>,
    ) -> Result<Response<pb::LoadAdapterResponse>, Status> {
        let request = request.into_inner();
        let mut adapters = self.adapters.lock().unwrap();
        if request.source == UNSERVABLE_ADAPTER {
            return Err(Status::invalid_argument(format!("{} has no adapter_config.json", request.source)));
        }
        if request.slot == 0 || adapters.contains_key(&request.slot) {
            return Err(Status::invalid_argument(format!("slot {} is in use", request.slot)));
        }
        adapters.insert(request.slot, request.adapter_id.clone());
        self.log.lock().unwrap().loaded_adapters.push((request.adapter_id, request.source, request.slot));
        Ok(Response::new(pb::LoadAdapterResponse {}))
    }

    async fn unload_adapter(
        &self,
        request: Request<pb::UnloadAdapterRequest>,
    ) -> Result<Response<pb::UnloadAdapterResponse>, Status> {
        let slot = request.into_inner().slot;
        if self.adapters.lock().unwrap().remove(&slot).is_none() {
            return Err(Status::invalid_argument(format!("no adapter in slot {slot}")));
        }
        self.log.lock().unwrap().unloaded_slots.push(slot);
        Ok(Response::new(pb::UnloadAdapterResponse {}))
    }

    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        Ok(Response::new(pb::HealthResponse {}))
    }

    async fn warmup(
        &self,
        _: Request<pb::WarmupRequest>,
    ) -> Result<Response<pb::WarmupResponse>, Status> {
        Ok(Response::new(pb::WarmupResponse {
            num_device_blocks: 256,
            num_host_blocks: 256,
            cost_model: Some(pb::CostModel {
                step_base_s: 0.002,
                per_prefill_token_s: 1e-5,
                per_decode_request_s: 1e-4,
                per_context_token_s: 1e-7,
                swap_out_bytes_per_s: 1e9,
                swap_in_bytes_per_s: 1e9,
                transfer_overhead_s: 1e-4,
                duplex: false,
                token_curve: None,
            }),
        }))
    }

    async fn reset(
        &self,
        _: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        let mut sequences = self.sequences.lock().unwrap();
        let dropped_requests = sequences.len() as u32;
        sequences.clear();
        Ok(Response::new(pb::ResetResponse { dropped_requests }))
    }

    async fn step(
        &self,
        request: Request<pb::StepRequest>,
    ) -> Result<Response<pb::StepResponse>, Status> {
        // A step takes a little time, as a model's would, so that long generations stay open.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let step = request.into_inner();
        let mut sequences = self.sequences.lock().unwrap();
        for id in &step.forget {
            if let Some(sequence) = sequences.remove(id) {
                self.log
                    .lock()
                    .unwrap()
                    .forgotten
                    .push((*id, sequence.sampled));
            }
        }
        let adapters = self.adapters.lock().unwrap().clone();
        for new in &step.new_requests {
            // As the real shard: the slot must hold the adapter the request names.
            if new.adapter_slot != 0 && adapters.get(&new.adapter_slot) != Some(&new.adapter_id) {
                return Err(Status::invalid_argument(format!("request {}: slot {} does not hold {}", new.id,
                    new.adapter_slot, new.adapter_id)));
            }
        }
        for new in step.new_requests {
            let prompt_tokens = new.prompt_token_ids.len();
            self.log.lock().unwrap().new_requests.push(new.clone());
            sequences.insert(
                new.id,
                Sequence {
                    known_tokens: prompt_tokens,
                    prompt_tokens,
                    sampled: 0,
                    request: new,
                },
            );
        }
        let mut outputs = Vec::new();
        for scheduled in &step.scheduled {
            let sequence = sequences.get_mut(&scheduled.id).ok_or_else(|| {
                Status::invalid_argument(format!("unknown request {}", scheduled.id))
            })?;
            let slot = sequence.request.adapter_slot;
            if slot != 0 && !adapters.contains_key(&slot) {
                return Err(Status::invalid_argument(format!("request {}: adapter slot {slot} is not loaded", scheduled.id)));
            }
            outputs.push(self.output(scheduled, sequence));
        }
        let completed_transfers = step
            .rotate_out
            .iter()
            .chain(&step.rotate_in)
            .map(|transfer| transfer.id)
            .collect();
        Ok(Response::new(pb::StepResponse {
            step_id: step.step_id,
            outputs,
            completed_transfers,
            timings: None,
        }))
    }
}
