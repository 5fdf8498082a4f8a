//! The agent's sending side, on a thread of its own: sampling never waits for a store.
//!
//! The recording loop hands each period's encoded requests over a bounded channel (a
//! period it cannot hand over is dropped and counted, never waited for) and goes back to
//! the ring buffer. This thread spools each request (`spool`), delivers the oldest of each
//! sink, and after a failure waits out that sink's backoff while the others go on. At
//! shutdown it tries what is left once more, for at most the flush time; what still
//! waits stays in the spool for the next start.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use log::{info, warn};
use tokio::{sync::mpsc, time::Instant};

use super::{
    backoff::{random_word, Backoff},
    headers::Headers,
    sink::{Sink, Transport},
    spool::Spool,
    status::{unix_now, SinkStatus, Status},
};

/// Periods the channel holds before one is dropped.
const QUEUE: usize = 8;

/// How the sender is set up.
pub struct SenderConfig {
    /// The sinks, in order.
    pub sinks: Vec<Sink>,
    /// Headers for every request.
    pub headers: Headers,
    /// Each request's time limit.
    pub timeout: Duration,
    /// The spool's directory (one subdirectory per sink); `None`: in memory.
    pub spool_dir: Option<PathBuf>,
    /// Each sink's spool bound.
    pub spool_bytes: u64,
    /// Where the status goes.
    pub status_file: Option<PathBuf>,
    /// How long shutdown may try to deliver what waits.
    pub flush: Duration,
    /// The retry schedule.
    pub backoff: Backoff,
}

/// One period's requests, one per sink (same order).
pub(crate) type Batch = Vec<Vec<u8>>;

/// The handle the recording loop holds.
pub(crate) struct Sender {
    queue: Option<mpsc::Sender<Batch>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The status both sides update.
    pub status: Arc<Mutex<Status>>,
}

struct SinkState {
    sink: Sink,
    spool: Spool,
    failures: u32,
    next_try: Instant,
    status: SinkStatus,
}

impl Sender {
    /// Opens the spools (an unusable spool directory is an error now, before anything is
    /// attached) and starts the thread.
    pub(crate) fn start(config: SenderConfig) -> anyhow::Result<Sender> {
        let mut sinks = Vec::new();
        for sink in &config.sinks {
            let spool = match &config.spool_dir {
                Some(dir) => Spool::on_disk(&dir.join(sink.spool_name()), config.spool_bytes)?,
                None => Spool::in_memory(config.spool_bytes),
            };
            if !spool.is_empty() {
                info!(
                    "{}: {} requests left from an earlier run, sent first",
                    sink.describe(),
                    spool.len()
                );
            }
            sinks.push(SinkState {
                sink: sink.clone(),
                spool,
                failures: 0,
                next_try: Instant::now(),
                status: SinkStatus {
                    sink: sink.describe(),
                    ..SinkStatus::default()
                },
            });
        }
        let transport = Transport::new(config.headers.clone(), config.timeout)?;
        let status = Arc::new(Mutex::new(Status {
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            started_unix: unix_now(),
            ..Status::default()
        }));
        let (queue, intake) = mpsc::channel(QUEUE);
        let shared = status.clone();
        let thread = std::thread::Builder::new()
            .name("allocscope-send".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => runtime.block_on(run(config, sinks, transport, intake, shared)),
                    Err(e) => log::error!("the sender cannot start: {e}"),
                }
            })
            .context("starting the sender thread")?;
        Ok(Sender {
            queue: Some(queue),
            thread: Some(thread),
            status,
        })
    }

    /// Hands over one period's requests; never waits (a full queue drops the period).
    pub(crate) fn send(&self, batch: Batch) {
        let Some(queue) = &self.queue else { return };
        if queue.try_send(batch).is_err() {
            warn!("the sender is behind: a period's profiles were dropped");
            if let Ok(mut status) = self.status.lock() {
                status.periods_dropped += 1;
            }
        }
    }

    /// Closes the queue and waits for the thread (which flushes for at most its flush time).
    pub(crate) fn finish(mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn run(
    config: SenderConfig,
    mut sinks: Vec<SinkState>,
    mut transport: Transport,
    mut intake: mpsc::Receiver<Batch>,
    status: Arc<Mutex<Status>>,
) {
    let mut closing: Option<Instant> = None;
    loop {
        let due = sinks
            .iter()
            .filter(|s| !s.spool.is_empty())
            .map(|s| s.next_try)
            .min();
        tokio::select! {
            batch = intake.recv(), if closing.is_none() => match batch {
                Some(batch) => {
                    for (state, request) in sinks.iter_mut().zip(batch) {
                        if let Err(e) = state.spool.push(&request) {
                            warn!("{}: {e:#}", state.sink.describe());
                            state.status.spool_failures += 1;
                            state.status.last_spool_error = Some(format!("{e:#}"));
                        }
                    }
                }
                None => {
                    closing = Some(Instant::now() + config.flush);
                    // Shutting down: what waits is tried once more now, backoff or not.
                    for state in &mut sinks {
                        state.next_try = Instant::now();
                    }
                }
            },
            _ = sleep_until(due), if due.is_some() => {}
            else => {}
        }
        for state in &mut sinks {
            deliver_due(state, &mut transport, &config.backoff, closing).await;
        }
        publish(&sinks, &status, config.status_file.as_deref());
        if let Some(deadline) = closing {
            let waiting = sinks.iter().any(|s| !s.spool.is_empty() && s.failures == 0);
            if !waiting || Instant::now() >= deadline {
                for state in &sinks {
                    let left = state.spool.len();
                    if left == 0 {
                        continue;
                    }
                    match state.spool.on_disk_at() {
                        Some(dir) => warn!(
                            "{}: {left} requests not delivered at shutdown: kept in the spool {}",
                            state.sink.describe(),
                            dir.display()
                        ),
                        None => warn!(
                            "{}: {left} requests not delivered at shutdown: lost (the spool is in memory)",
                            state.sink.describe()
                        ),
                    }
                }
                return;
            }
        }
    }
}

/// Sleeps until `due` (an hour when there is none: the branch is then disabled anyway).
async fn sleep_until(due: Option<Instant>) {
    tokio::time::sleep_until(due.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)))
        .await;
}

/// Delivers `state`'s requests, oldest first, while they go through; after a failure sets
/// the next try.
async fn deliver_due(
    state: &mut SinkState,
    transport: &mut Transport,
    backoff: &Backoff,
    closing: Option<Instant>,
) {
    while Instant::now() >= state.next_try {
        if closing.is_some_and(|deadline| Instant::now() >= deadline) {
            return;
        }
        let request = match state.spool.front() {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(e) => {
                warn!("{}: {e:#}; dropping it", state.sink.describe());
                state.spool.pop();
                continue;
            }
        };
        let delivered = deliver_before(transport, &state.sink, &request, closing).await;
        match delivered {
            Ok(()) => {
                state.spool.pop();
                if state.failures > 0 {
                    warn!(
                        "{}: delivered again after {} failed attempts",
                        state.sink.describe(),
                        state.failures
                    );
                }
                state.failures = 0;
                state.status.pushed += 1;
                state.status.last_push_unix = Some(unix_now());
                state.status.last_error = None;
            }
            Err(failure) => {
                state.status.failures += 1;
                state.status.last_error = Some(failure.message.clone());
                if failure.retry {
                    state.failures += 1;
                    let wait = backoff.wait(state.failures, random_word());
                    // A store down for a day would fill the journal: the first failure
                    // and then every power of two are said (the status file has each).
                    let level = if state.failures.is_power_of_two() {
                        log::Level::Warn
                    } else {
                        log::Level::Debug
                    };
                    log::log!(
                        level,
                        "{}: {} (attempt {}; next in {:.1} s)",
                        state.sink.describe(),
                        failure.message,
                        state.failures,
                        wait.as_secs_f64()
                    );
                    state.next_try = Instant::now() + wait;
                    // At shutdown one more failure ends the flush of this sink.
                    return;
                }
                warn!(
                    "{}: refused: {}; dropping the request",
                    state.sink.describe(),
                    failure.message
                );
                state.status.refused += 1;
                state.spool.pop();
            }
        }
    }
}

/// Delivers `request` to `sink`; at shutdown (`closing`) within what is left of the flush
/// time, no more.
async fn deliver_before(
    transport: &mut Transport,
    sink: &super::sink::Sink,
    request: &[u8],
    closing: Option<Instant>,
) -> Result<(), super::sink::Failure> {
    let Some(deadline) = closing else {
        return transport.deliver(sink, request).await;
    };
    tokio::time::timeout_at(deadline, transport.deliver(sink, request))
        .await
        .unwrap_or_else(|_| {
            Err(super::sink::Failure {
                retry: true,
                message: "the flush time ran out while sending".into(),
            })
        })
}

/// Updates the shared status and writes the file.
fn publish(sinks: &[SinkState], status: &Mutex<Status>, file: Option<&std::path::Path>) {
    let Ok(mut status) = status.lock() else {
        return;
    };
    status.sinks = sinks
        .iter()
        .map(|state| SinkStatus {
            failures_in_a_row: state.failures,
            queued: state.spool.len(),
            queued_bytes: state.spool.bytes(),
            dropped: state.spool.dropped,
            dropped_bytes: state.spool.dropped_bytes,
            ..state.status.clone()
        })
        .collect();
    status.refresh_own();
    if let Some(file) = file {
        if let Err(e) = status.write(file) {
            warn!("writing the status file {}: {e}", file.display());
        }
    }
}
