//! The engine task: the one owner of the scheduler, the shard client and every request's
//! stream. Each turn it applies the commands that arrived (so cancelled requests free their
//! blocks before the next plan), then schedule → run → postprocess. It sleeps on its command
//! channel when there is nothing to compute. A failed or late step puts it into recovery
//! (`recovery.rs`); a shard that does not come back ends it for good.
use std::time::{Duration, Instant};

use superinfer_scheduler::{RequestSpec, Scheduler, SchedulerConfig, SchedulerError, SchedulerStats};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::active::{ActiveRequest, ActiveRequests};
use super::api::{EngineError, EngineEvent, GenerationRequest};
use super::constraints::allowed_tokens;
use super::handle::{Command, EngineHandle, EngineStatus};
use super::metrics;
use super::postprocess::apply_step_response;
use super::recovery::{EngineTimeouts, Recovery, RecoveryTurn};
use super::step_request::build_step_request;
use super::step_trace::annotate_step;
use crate::client::ShardClient;

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
    let scheduler = Scheduler::new(config.scheduler)?;
    let (commands_tx, commands) = mpsc::unbounded_channel();
    let (status_tx, status) = watch::channel(EngineStatus::Running);
    let engine = Engine {
        scheduler,
        client,
        requests: ActiveRequests::default(),
        forget: Vec::new(),
        eos_token_ids: config.eos_token_ids,
        timeouts: config.timeouts,
        clock_origin: Instant::now(),
        status: status_tx,
        recovery: None,
        draining: false,
        drain_waiters: Vec::new(),
        last_stats: SchedulerStats::default(),
        previous_step_end: None,
    };
    tracker.spawn(engine.run(commands, shutdown));
    Ok(EngineHandle::new(commands_tx, status))
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
    /// Set while the shard is failed and being probed; the engine then plans nothing.
    pub(super) recovery: Option<Recovery>,
    /// Set by a drain: no new requests, whatever the shard's state.
    pub(super) draining: bool,
    /// Drains waiting for the last request to end.
    drain_waiters: Vec<oneshot::Sender<()>>,
    pub(super) last_stats: SchedulerStats,
    /// When the previous step's reply was applied, while steps follow back to back.
    previous_step_end: Option<Instant>,
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
        loop {
            while let Ok(command) = commands.try_recv() {
                self.handle(command).await;
            }
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
            if shutdown.is_cancelled() {
                break;
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
        if !self.scheduler.has_work() {
            return Turn::Idle { wait: Duration::MAX / 4 };
        }
        self.turn().await
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Submit { id, request, events } => self.submit(id, request, events),
            Command::Cancel { id } => {
                if self.requests.get(id).is_some() {
                    tracing::debug!(id, "request cancelled");
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
        }
    }

    fn submit(&mut self, id: u64, request: GenerationRequest, events: mpsc::UnboundedSender<EngineEvent>) {
        // A request can race a status change: the handle checked before the engine changed it.
        if let Some(refusal) = self.refusal() {
            let _ = events.send(EngineEvent::Failed(refusal));
            return;
        }
        match self.scheduler.add(self.spec(id, &request), self.clock()) {
            Ok(()) => self.requests.insert(id, ActiveRequest::new(request, events)),
            Err(error) => {
                tracing::debug!(id, %error, "request refused by the scheduler");
                let _ = events.send(EngineEvent::Failed(refusal(error)));
            }
        }
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

    /// Plans one step and runs it on the shard.
    async fn turn(&mut self) -> Turn {
        let plan = self.scheduler.plan(self.clock());
        let stats = self.scheduler.stats();
        let transfers_in_flight = stats.rotating_in + stats.rotating_out > 0;
        if plan.is_empty() && !transfers_in_flight {
            return Turn::Idle { wait: IDLE_REPLAN };
        }
        if plan.is_empty() {
            // Only an acknowledgement can unblock the scheduler; ask for it after a pause.
            tokio::time::sleep(TRANSFER_POLL).await;
        }
        let masks = allowed_tokens(&plan.sampling, &mut self.requests);
        let request = build_step_request(&plan, std::mem::take(&mut self.forget), &mut self.requests, masks, Instant::now());
        let started = Instant::now();
        if let Some(previous) = self.previous_step_end.take() {
            metrics::record_turn(started.saturating_duration_since(previous));
        }
        let deadline = self.timeouts.step_deadline(plan.predicted_step_s);
        let span = tracing::info_span!("step", step_id = plan.step_id, requests = plan.scheduled.len(),
            tokens = plan.num_batched_tokens(), swap_out = plan.rotate_out.len(), swap_in = plan.rotate_in.len());
        annotate_step(&span, &plan, &self.requests, self.scheduler.config().block_bytes);
        let response = match self.client.step(request, deadline).instrument(span).await {
            Ok(response) => response,
            Err(error) => {
                self.on_shard_failure(error);
                return Turn::Stepped;
            }
        };
        let correction = self.scheduler.cost_model().correction;
        metrics::record_step(&plan, started.elapsed(), response.timings.as_ref(), correction);
        let outcome = apply_step_response(response, &mut self.requests, &self.eos_token_ids, Instant::now());
        self.scheduler.complete(&outcome.results, self.clock());
        for (id, _reason) in outcome.finished {
            self.record_attainment(id);
            self.scheduler.finish(id);
            self.release(id);
        }
        for id in outcome.disconnected.into_iter().chain(outcome.failed) {
            self.scheduler.cancel(id);
            self.release(id);
        }
        self.previous_step_end = Some(Instant::now());
        Turn::Stepped
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
        let stats = self.scheduler.stats();
        metrics::record_scheduler(&stats, &self.last_stats, self.requests.len());
        metrics::record_lags(&self.scheduler.take_lag_samples());
        self.last_stats = stats;
    }

    /// Counts a finished request as meeting or missing its objectives (its own, else the
    /// server's defaults).
    fn record_attainment(&self, id: u64) {
        let Some(active) = self.requests.get(id) else { return };
        let slo = active.request.slo.unwrap_or(self.scheduler.config().default_slo);
        let percentile = self.scheduler.config().tbt_percentile;
        if let Some(attainment) = active.token_times.attainment(active.request.arrival, slo, percentile) {
            metrics::record_attainment(attainment);
        }
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
