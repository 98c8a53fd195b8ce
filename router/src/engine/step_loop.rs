//! The engine task: the one owner of the scheduler, the shard client and every request's
//! stream. Each turn it applies the commands that arrived (so cancelled requests free their
//! blocks before the next plan), then schedule → run → postprocess. It sleeps on its command
//! channel when there is nothing to compute. A failed or late step puts it into recovery
//! (`recovery.rs`); a shard that does not come back ends it for good.
//!
//! With `async_scheduling` (one step in flight) the engine plans and sends step N+1 before it
//! awaits step N's reply, so its own work (postprocessing, planning, the RPC) overlaps the
//! shard's compute; the shard runs N+1 right after N (`previous_step_id`) and feeds the tokens
//! N sampled to the decodes N+1 planned on placeholders. Stops are therefore applied one step
//! late: a request that ends in N may have one more token computed in N+1, whose output is
//! dropped (the request is gone from `requests`) — never streamed; its blocks are freed at
//! once, which is safe because the shard runs the steps in order, so N+1 is done with them
//! before any later step reuses them.
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use superinfer_scheduler::{RequestSpec, Scheduler, SchedulerConfig, SchedulerError, SchedulerStats, StepPlan};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::active::{ActiveRequest, ActiveRequests};
use super::adapters::AdapterRegistry;
use super::admission::{Admission, AdmissionGate};
use super::attainment::RecentAttainment;
use super::api::{EngineError, EngineEvent, FinishReason, GenerationRequest};
use super::constraints::allowed_tokens;
use super::handle::{Command, EngineHandle, EngineLoad, EngineStatus};
use super::metrics;
use super::postprocess::{align_prompt_logprobs, apply_step_response};
use super::recovery::{EngineTimeouts, Recovery, RecoveryTurn};
use super::step_request::build_step_request;
use super::step_trace::annotate_step;
use super::vllm_metrics;
use crate::client::{ClientError, ShardClient};
use crate::kv_events::KvEventSink;
use crate::pb;

/// While transfers are in flight and nothing can be computed, the engine polls the shard for
/// their completion this often (completions only come back with Step replies).
const TRANSFER_POLL: Duration = Duration::from_millis(1);
/// Upper bound on an idle wait, so time-driven policy decisions are re-planned.
const IDLE_REPLAN: Duration = Duration::from_millis(500);

/// What the engine needs besides the shard client.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub scheduler: SchedulerConfig,
    /// Tokens that end a generation (unless the request ignores EOS).
    pub eos_token_ids: Vec<u32>,
    pub timeouts: EngineTimeouts,
    /// One step in flight: plan and send the next step before the previous reply is applied
    /// (`--async-scheduling`).
    pub async_scheduling: bool,
    /// Admit everything, or only requests that can meet their first-token objective.
    pub admission: Admission,
    /// Fail queued requests (never started) this long past their first-token deadline.
    pub queue_timeout: Option<Duration>,
    /// Where the prefix cache's changes go each turn (`--kv-events-config`); none: not recorded.
    pub kv_events: Option<KvEventSink>,
    /// The LoRA adapters served (the shard's at start, then those loaded at run time).
    pub adapters: Arc<AdapterRegistry>,
}

/// Starts the engine task on `tracker`; it stops when `shutdown` is cancelled, failing the
/// requests still in flight with `EngineError::Stopped`, or when it gives up on the shard
/// (`EngineHandle::stopped` then resolves with the reason).
pub fn spawn_engine(
    config: EngineConfig,
    client: ShardClient,
    tracker: &TaskTracker,
    shutdown: CancellationToken,
) -> Result<EngineHandle, SchedulerError> {
    metrics::describe();
    vllm_metrics::describe();
    let admission = match config.admission {
        Admission::All => None,
        Admission::Slo { slack_s } => Some(Arc::new(AdmissionGate::new(slack_s, config.scheduler.default_slo))),
    };
    let mut scheduler = Scheduler::new(config.scheduler)?;
    if config.kv_events.is_some() {
        scheduler.enable_kv_events();
    }
    let (commands_tx, commands) = mpsc::unbounded_channel();
    let (status_tx, status) = watch::channel(EngineStatus::Running);
    let (load_tx, load) = watch::channel(EngineLoad::default());
    let engine = Engine {
        scheduler,
        client,
        requests: ActiveRequests::default(),
        forget: Vec::new(),
        eos_token_ids: config.eos_token_ids,
        timeouts: config.timeouts,
        clock_origin: Instant::now(),
        status: status_tx,
        load: load_tx,
        recovery: None,
        draining: false,
        drain_waiters: Vec::new(),
        last_stats: SchedulerStats::default(),
        recent_attainment: RecentAttainment::default(),
        previous_step_end: None,
        async_scheduling: config.async_scheduling,
        in_flight: VecDeque::new(),
        admission: admission.clone(),
        arrived_tokens: 0,
        queue_timeout: config.queue_timeout,
        kv_events: config.kv_events,
        retired_adapters: HashSet::new(),
        unloading: Vec::new(),
        adapters: config.adapters.clone(),
        lora_info: None,
    };
    tracker.spawn(engine.run(commands, shutdown));
    Ok(EngineHandle::new(commands_tx, status, load, admission, config.adapters))
}

pub(super) struct Engine {
    pub(super) scheduler: Scheduler,
    pub(super) client: ShardClient,
    pub(super) requests: ActiveRequests,
    /// Requests the shard knows and must drop with the next step.
    pub(super) forget: Vec<u64>,
    eos_token_ids: Vec<u32>,
    pub(super) timeouts: EngineTimeouts,
    /// Zero of the scheduler's clock (it takes seconds as f64).
    clock_origin: Instant,
    pub(super) status: watch::Sender<EngineStatus>,
    /// The requests held, by phase, as of the last turn (`EngineHandle::load`).
    load: watch::Sender<EngineLoad>,
    /// Set while the shard is failed and being probed; the engine then plans nothing.
    pub(super) recovery: Option<Recovery>,
    /// Set by a drain: no new requests, whatever the shard's state.
    pub(super) draining: bool,
    /// Drains waiting for the last request to end.
    drain_waiters: Vec<oneshot::Sender<()>>,
    pub(super) last_stats: SchedulerStats,
    /// Finished requests' joint verdicts over the last minute (`superinfer_slo_joint_attainment_recent`).
    recent_attainment: RecentAttainment,
    /// When the previous step's reply was applied, while steps follow back to back.
    previous_step_end: Option<Instant>,
    /// See `EngineConfig::async_scheduling`.
    async_scheduling: bool,
    /// Steps sent and not yet applied, oldest first: at most one, or two with
    /// `async_scheduling`.
    pub(super) in_flight: VecDeque<InFlight>,
    /// SLO admission's gate, given a fresh view of the scheduler every turn.
    admission: Option<Arc<AdmissionGate>>,
    /// Prompt tokens the gate counted in transit that arrived since its last view.
    arrived_tokens: u64,
    /// See `EngineConfig::queue_timeout`.
    queue_timeout: Option<Duration>,
    /// See `EngineConfig::kv_events`.
    kv_events: Option<KvEventSink>,
    /// Slots of adapters no longer served: a request naming one (it raced the unload) is refused.
    retired_adapters: HashSet<u64>,
    /// Retired slots still installed on the shard, unloaded once nothing held uses them.
    unloading: Vec<u64>,
    /// The adapters served (`vllm:lora_requests_info`'s `max_lora` is `--max-loras`, or their count).
    adapters: Arc<AdapterRegistry>,
    /// `vllm:lora_requests_info` as last recorded: its labels and when.
    lora_info: Option<(String, String, usize, Instant)>,
}

/// A step sent to the shard whose reply the engine has not applied yet.
pub(super) struct InFlight {
    plan: StepPlan,
    started: Instant,
    reply: JoinHandle<Result<pb::StepResponse, ClientError>>,
    /// The adapter slots the step computes with (the shard needs them until it has run).
    adapter_slots: Vec<u64>,
}

/// What the loop does after planning.
enum Turn {
    Stepped,
    /// Nothing to compute: wait for a command (or poll transfers after `wait`).
    Idle { wait: Duration },
    /// The engine cannot serve again.
    Stop,
}

impl Engine {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>, shutdown: CancellationToken) {
        // Checked every turn, not only when idle: a stop fails what is in flight at once.
        while !shutdown.is_cancelled() {
            while let Ok(command) = commands.try_recv() {
                self.handle(command).await;
            }
            self.unload_adapters().await;
            self.publish_stats();
            self.answer_drains();
            let wait = match self.next_turn().await {
                Turn::Stepped => continue,
                Turn::Idle { wait } => wait,
                Turn::Stop => break,
            };
            // Time spent waiting for work is not the engine's overhead.
            self.previous_step_end = None;
            tokio::select! {
                command = commands.recv() => match command {
                    Some(command) => self.handle(command).await,
                    None => break,
                },
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        tracing::info!(requests = self.requests.len(), "engine stopping");
        self.fail_all(EngineError::Stopped);
        self.answer_drains();
    }

    async fn next_turn(&mut self) -> Turn {
        if matches!(*self.status.borrow(), EngineStatus::Failed(_)) {
            return Turn::Stop;
        }
        if self.recovery.is_some() {
            return match self.recover().await {
                RecoveryTurn::Recovered => Turn::Stepped,
                RecoveryTurn::Wait(wait) => Turn::Idle { wait },
                RecoveryTurn::GiveUp => Turn::Stop,
            };
        }
        if !self.scheduler.has_work() && self.in_flight.is_empty() {
            return Turn::Idle { wait: Duration::MAX / 4 };
        }
        self.turn().await
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Submit { id, request, events, admitted_tokens } => {
                self.arrived_tokens += admitted_tokens;
                self.submit(id, request, events)
            }
            Command::Cancel { id } => {
                if self.requests.get(id).is_some() {
                    tracing::debug!(id, "request cancelled");
                    vllm_metrics::record_aborted();
                    self.scheduler.cancel(id);
                    self.release(id);
                }
            }
            Command::Health { reply } => {
                let answer = self.health().await;
                // The asker may have given up waiting; nothing to do then.
                let _ = reply.send(answer);
            }
            Command::Drain { reply } => {
                if !self.draining {
                    tracing::info!(requests = self.requests.len(), "draining: new requests are refused");
                }
                self.draining = true;
                self.status.send_if_modified(|status| {
                    let running = *status == EngineStatus::Running;
                    if running {
                        *status = EngineStatus::Draining;
                    }
                    running
                });
                self.drain_waiters.push(reply);
            }
            Command::LoadAdapter { id, source, slot, reply } => {
                // Off the engine's task: the shard reads the adapter while steps go on.
                let mut client = self.client.clone();
                tokio::spawn(async move {
                    let _ = reply.send(client.load_adapter(&id, &source, slot).await);
                });
            }
            Command::RetireAdapter { slot } => {
                if self.retired_adapters.insert(slot) {
                    // No request gets the slot again: its cached prefixes are dead weight, and
                    // a KV-aware router must stop counting on them.
                    let forgotten = self.scheduler.retire_kv_namespace(slot);
                    tracing::debug!(slot, forgotten, "prefix-cache blocks of a retired LoRA adapter forgotten");
                    self.unloading.push(slot);
                }
            }
        }
    }

    /// Unloads from the shard the retired adapters that no request held (queued, running,
    /// rotated out) and no step in flight uses. A refusal means the shard does not hold it (a
    /// load that failed); a shard out of reach or late is asked again on a later turn; any other
    /// failure leaves the weights on the shard (logged), not asked again every turn.
    async fn unload_adapters(&mut self) {
        if self.unloading.is_empty() || self.recovery.is_some() {
            return;
        }
        let mut in_use: HashSet<u64> = self.in_flight.iter().flat_map(|step| step.adapter_slots.iter().copied()).collect();
        in_use.extend(self.requests.adapter_slots());
        let mut still = Vec::new();
        for slot in std::mem::take(&mut self.unloading) {
            if in_use.contains(&slot) {
                still.push(slot);
                continue;
            }
            match self.client.unload_adapter(slot).await {
                Ok(()) => tracing::info!(slot, "LoRA adapter unloaded from the shard"),
                Err(ClientError::InvalidPlan(reason)) => tracing::debug!(slot, %reason, "LoRA adapter not on the shard"),
                Err(error @ (ClientError::Unavailable(_) | ClientError::Timeout(_))) => {
                    tracing::warn!(slot, %error, "cannot unload a LoRA adapter from the shard yet");
                    still.push(slot);
                }
                Err(error) => tracing::error!(slot, %error, "the shard failed to unload a LoRA adapter; its weights stay"),
            }
        }
        self.unloading = still;
    }

    fn submit(&mut self, id: u64, request: GenerationRequest, events: mpsc::UnboundedSender<EngineEvent>) {
        // A request can race a status change: the handle checked before the engine changed it.
        if let Some(refusal) = self.refusal() {
            let _ = events.send(EngineEvent::Failed(refusal));
            return;
        }
        // Or an unload: it named the adapter before it was taken away.
        if let Some(adapter) = request.adapter.as_ref().filter(|adapter| self.retired_adapters.contains(&adapter.namespace)) {
            let _ = events.send(EngineEvent::Failed(EngineError::Rejected(format!("the lora adapter '{}' was unloaded", adapter.id))));
            return;
        }
        match self.admit(self.spec(id, &request), request.constraint.is_some()) {
            Ok(()) => self.requests.insert(id, ActiveRequest::new(request, events)),
            Err(error) => {
                tracing::debug!(id, %error, "request refused by the scheduler");
                let _ = events.send(EngineEvent::Failed(refusal(error)));
            }
        }
    }

    /// Hands a request to the scheduler. A request under a grammar is never scheduled past a
    /// token the engine has not seen: its next mask needs that token.
    pub(super) fn admit(&mut self, spec: RequestSpec, constrained: bool) -> Result<(), SchedulerError> {
        let id = spec.id;
        self.scheduler.add(spec, self.clock())?;
        if constrained {
            self.scheduler.wait_for_results(id);
        }
        Ok(())
    }

    fn refusal(&self) -> Option<EngineError> {
        self.status.borrow().refusal()
    }

    /// The scheduler's view of a request.
    pub(super) fn spec(&self, id: u64, request: &GenerationRequest) -> RequestSpec {
        RequestSpec {
            id,
            prompt_token_ids: request.prompt_token_ids.clone(),
            max_new_tokens: request.max_new_tokens,
            slo: request.slo,
            arrival: request.arrival.saturating_duration_since(self.clock_origin).as_secs_f64(),
            priority: request.priority,
            kv_namespace: request.adapter.as_ref().map_or(0, |adapter| adapter.namespace),
            scores_prompt: request.prompt_logprobs,
        }
    }

    /// While requests run, a successful last step proves the shard alive; when idle, ask it.
    async fn health(&mut self) -> Result<(), EngineError> {
        if let Some(refusal) = self.refusal().filter(|refusal| *refusal != EngineError::Draining) {
            return Err(refusal);
        }
        if self.scheduler.has_work() {
            return Ok(());
        }
        match self.client.health().await {
            Ok(()) => Ok(()),
            Err(error) => {
                let message = error.to_string();
                self.on_shard_failure(error);
                Err(EngineError::Unavailable(message))
            }
        }
    }

    /// Plans and sends steps until the pipeline is full (one step, or two with
    /// `async_scheduling`), then applies the oldest step's reply. While a request decodes
    /// under a grammar, one step at a time: it could only be scheduled every other step (its
    /// mask needs its last token), which would halve its token rate to spare the others
    /// the ~1.5 ms that one step in flight hides.
    async fn turn(&mut self) -> Turn {
        let depth = if self.async_scheduling && !self.requests.any_constrained() { 2 } else { 1 };
        while self.in_flight.len() < depth {
            let plan = self.scheduler.plan(self.clock());
            if !plan.is_empty() {
                self.send(plan);
                continue;
            }
            if !self.in_flight.is_empty() {
                break; // its reply is what the requests wait for
            }
            let stats = self.scheduler.stats();
            if stats.rotating_in + stats.rotating_out == 0 {
                return Turn::Idle { wait: IDLE_REPLAN };
            }
            // Only an acknowledgement can unblock the scheduler; ask for it after a pause.
            tokio::time::sleep(TRANSFER_POLL).await;
            self.send(plan);
        }
        let Some(step) = self.in_flight.pop_front() else { return Turn::Stepped };
        let response = match step.reply.await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => {
                self.on_shard_failure(error);
                return Turn::Stepped;
            }
            Err(join) => {
                self.on_shard_failure(ClientError::Unavailable(format!("the step's task ended: {join}")));
                return Turn::Stepped;
            }
        };
        let correction = self.scheduler.cost_model().correction;
        metrics::record_step(&step.plan, step.started.elapsed(), response.timings.as_ref(), correction);
        align_prompt_logprobs(&step.plan.scheduled, &mut self.requests);
        let outcome = apply_step_response(response, &mut self.requests, &self.eos_token_ids, Instant::now());
        self.scheduler.complete(&outcome.results, self.clock());
        for (id, reason) in outcome.finished {
            self.record_attainment(id);
            self.record_finished(id, reason);
            self.scheduler.finish(id);
            self.release(id);
        }
        outcome.disconnected.iter().for_each(|_| vllm_metrics::record_aborted());
        for id in outcome.disconnected.into_iter().chain(outcome.failed) {
            self.scheduler.cancel(id);
            self.release(id);
        }
        self.previous_step_end = Some(Instant::now());
        Turn::Stepped
    }

    /// Sends `plan` to the shard; its reply is awaited by a later `turn`.
    fn send(&mut self, plan: StepPlan) {
        let masks = allowed_tokens(&plan.sampling, &mut self.requests);
        let mut request = build_step_request(&plan, std::mem::take(&mut self.forget), &mut self.requests, masks, Instant::now());
        // The shard runs this step right after the one still outstanding.
        request.previous_step_id = self.in_flight.back().map_or(0, |step| step.plan.step_id);
        let started = Instant::now();
        if let Some(previous) = self.previous_step_end.take() {
            metrics::record_turn(started.saturating_duration_since(previous));
        }
        let deadline = self.timeouts.step_deadline(plan.predicted_step_s);
        let span = tracing::info_span!("step", step_id = plan.step_id, requests = plan.scheduled.len(),
            tokens = plan.num_batched_tokens(), swap_out = plan.rotate_out.len(), swap_in = plan.rotate_in.len());
        annotate_step(&span, &plan, &self.requests, self.scheduler.config().block_bytes);
        let adapter_slots = plan
            .scheduled
            .iter()
            .filter_map(|entry| self.requests.get(entry.id)?.request.adapter.as_ref().map(|adapter| adapter.namespace))
            .collect();
        let mut client = self.client.clone();
        let reply = tokio::spawn(async move { client.step(request, deadline).await }.instrument(span));
        self.in_flight.push_back(InFlight { plan, started, reply, adapter_slots });
    }

    /// Drops the steps still in flight after a failure (their RPCs are cancelled; the shard
    /// is reset before serving again).
    pub(super) fn abandon_in_flight(&mut self) {
        for step in self.in_flight.drain(..) {
            step.reply.abort();
        }
    }

    /// Forgets a finished or cancelled request; the shard drops its state with the next step.
    pub(super) fn release(&mut self, id: u64) {
        if let Some(active) = self.requests.remove(id) {
            if active.sent_to_shard {
                self.forget.push(id);
            }
        }
    }

    pub(super) fn fail_all(&mut self, error: EngineError) {
        self.abandon_in_flight();
        for (id, active) in self.requests.drain() {
            self.scheduler.cancel(id);
            active.send(EngineEvent::Failed(error.clone()));
        }
    }

    /// Answers the drains once no request is left.
    fn answer_drains(&mut self) {
        if self.requests.len() == 0 {
            for waiter in self.drain_waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
    }

    pub(super) fn publish_stats(&mut self) {
        self.expire_queued();
        if let Some(sink) = &self.kv_events {
            let events = self.scheduler.take_kv_events();
            if !events.is_empty() {
                sink.publish(events);
            }
        }
        if let Some(gate) = &self.admission {
            gate.published(self.scheduler.admission_view(), std::mem::take(&mut self.arrived_tokens));
        }
        let stats = self.scheduler.stats();
        let load = EngineLoad { running: stats.running, waiting: stats.waiting, rotated: stats.rotated };
        self.load.send_if_modified(|published| std::mem::replace(published, load) != load);
        metrics::record_scheduler(&stats, &self.last_stats, self.requests.len());
        vllm_metrics::record_scheduler(&stats, &self.last_stats);
        metrics::record_lags(&self.scheduler.take_lag_samples());
        metrics::record_recent_attainment(self.recent_attainment.share(Instant::now()));
        self.last_stats = stats;
        self.record_lora_info();
    }

    /// `vllm:lora_requests_info`, while adapters are served (or were): when the adapters of the
    /// requests change, and every second while the engine turns (its value is the time of the
    /// record).
    fn record_lora_info(&mut self) {
        // vLLM's `max_lora` is its `--max-loras`; without one, every adapter served can run.
        let max_lora = self.adapters.max().unwrap_or_else(|| self.adapters.count());
        if self.adapters.count() == 0 && self.lora_info.is_none() {
            return;
        }
        let (mut running, mut waiting) = (Vec::new(), Vec::new());
        for active in self.requests.values() {
            if let Some(adapter) = &active.request.adapter {
                if active.sent_to_shard { &mut running } else { &mut waiting }.push(adapter.id.as_str());
            }
        }
        let join = |mut names: Vec<&str>| {
            names.sort_unstable();
            names.dedup();
            names.join(",")
        };
        let (running, waiting) = (join(running), join(waiting));
        let unchanged = self.lora_info.as_ref().is_some_and(|(last_running, last_waiting, last_max, at)| {
            *last_running == running && *last_waiting == waiting && *last_max == max_lora && at.elapsed() < Duration::from_secs(1)
        });
        if !unchanged {
            vllm_metrics::record_lora_info(&running, &waiting, max_lora);
            self.lora_info = Some((running, waiting, max_lora, Instant::now()));
        }
    }

    /// Fails the queued requests past their first-token deadline by more than the queue
    /// time-out (`--queue-timeout-ms`).
    fn expire_queued(&mut self) {
        let Some(timeout) = self.queue_timeout else { return };
        for id in self.scheduler.expire_queued(self.clock(), timeout.as_secs_f64()) {
            let Some(active) = self.requests.get(id) else { continue };
            let waited_ms = active.request.arrival.elapsed().as_millis() as u64;
            tracing::debug!(id, waited_ms, "queued request timed out");
            metrics::record_queue_timeout(active.request.priority);
            active.send(EngineEvent::Failed(EngineError::QueueTimeout { waited_ms }));
            self.release(id);
        }
    }

    /// Counts a finished request as meeting or missing its objectives (its own, else the
    /// server's defaults), by its priority class.
    fn record_attainment(&mut self, id: u64) {
        let Some(active) = self.requests.get(id) else { return };
        let slo = active.request.slo.unwrap_or(self.scheduler.config().default_slo);
        let percentile = self.scheduler.config().tbt_percentile;
        if let Some(attainment) = active.token_times.attainment(active.request.arrival, slo, percentile) {
            metrics::record_attainment(attainment, active.request.priority);
            self.recent_attainment.record(Instant::now(), attainment.joint());
        }
    }

    /// vLLM's per-request series for a request that generated to its end.
    fn record_finished(&self, id: u64, reason: FinishReason) {
        let Some(active) = self.requests.get(id) else { return };
        let arrival = active.request.arrival;
        vllm_metrics::record_finished(&vllm_metrics::Finished {
            reason,
            end_to_end: arrival.elapsed(),
            queued: active.first_scheduled.map(|first| first.saturating_duration_since(arrival)),
            prompt_tokens: active.request.prompt_token_ids.len() as u32,
            generated_tokens: active.generated_tokens,
        });
    }

    /// Seconds since the engine started: the scheduler's clock.
    pub(super) fn clock(&self) -> f64 {
        self.clock_origin.elapsed().as_secs_f64()
    }
}

pub(super) fn refusal(error: SchedulerError) -> EngineError {
    match error {
        SchedulerError::TooLarge { needed_blocks, device_blocks, .. } => EngineError::TooLarge {
            needed: u32::try_from(needed_blocks).unwrap_or(u32::MAX),
            available: device_blocks,
        },
        other => EngineError::Rejected(other.to_string()),
    }
}
