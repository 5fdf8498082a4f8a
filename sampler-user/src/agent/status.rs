//! The agent's status file (`--status`): what an operator, a health check or a monitoring
//! scrape reads to know the agent is doing its job. JSON, replaced atomically after every
//! period and every delivery attempt: the last push per sink, what waits and what was
//! dropped, the ring buffer's losses, and the agent's own RSS, heap and CPU time.

use std::path::Path;

use serde::Serialize;

/// The whole file.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Status {
    /// allocscope's version.
    pub version: &'static str,
    /// The agent's pid.
    pub pid: u32,
    /// When it started (Unix seconds).
    pub started_unix: u64,
    /// When this file was written (Unix seconds).
    pub updated_unix: u64,
    /// Periods closed so far.
    pub periods: u64,
    /// When the last period closed (Unix seconds).
    pub last_period_unix: Option<u64>,
    /// Processes with something in the last period.
    pub last_period_processes: usize,
    /// Periods in which no process allocated or held anything: nothing was sent.
    pub periods_empty: u64,
    /// Periods the sender could not take (it was behind by more than its queue): dropped.
    pub periods_dropped: u64,
    /// Samples the kernel could not deliver, over the whole run (ring buffer full).
    pub samples_lost: u64,
    /// The agent's resident memory.
    pub rss_bytes: Option<u64>,
    /// The agent's CPU time (user + system).
    pub cpu_seconds: Option<f64>,
    /// The bytes of the blocks its allocator has handed it and not had back (touched or
    /// not: it can exceed what is resident).
    pub heap_in_use_bytes: u64,
    /// What its allocator keeps free for later (resident or given back to the kernel).
    pub heap_free_bytes: u64,
    /// Per sink.
    pub sinks: Vec<SinkStatus>,
}

/// One sink's state.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct SinkStatus {
    /// `pyroscope http://…`, `otlp-grpc http://…`.
    pub sink: String,
    /// Requests delivered.
    pub pushed: u64,
    /// When the last one was (Unix seconds).
    pub last_push_unix: Option<u64>,
    /// The last failure, if the last attempt failed.
    pub last_error: Option<String>,
    /// Failed attempts in a row.
    pub failures_in_a_row: u32,
    /// Failed attempts in all.
    pub failures: u64,
    /// Requests the sink refused for good (dropped).
    pub refused: u64,
    /// Requests waiting (in the spool).
    pub queued: usize,
    /// Their bytes.
    pub queued_bytes: u64,
    /// Requests dropped to keep the spool within its bound.
    pub dropped: u64,
    /// Their bytes.
    pub dropped_bytes: u64,
    /// Requests that could not be written to the spool directory (a full or broken file
    /// system): kept in memory instead, lost if the agent stops before they are sent.
    pub spool_failures: u64,
    /// Why the last of them could not.
    pub last_spool_error: Option<String>,
}

/// Now, in Unix seconds.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Status {
    /// Refreshes the agent's own figures and the time.
    pub(crate) fn refresh_own(&mut self) {
        self.updated_unix = unix_now();
        self.cpu_seconds = crate::sys::own::cpu_ns().map(|ns| ns as f64 / 1e9);
        self.rss_bytes = crate::sys::own::rss_bytes();
        let heap = crate::sys::own::heap();
        self.heap_in_use_bytes = heap.in_use;
        self.heap_free_bytes = heap.free;
    }

    /// Writes the file (atomically).
    pub(crate) fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::outfile::write_replacing(path, |out| out.write_all(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_figures_are_read() {
        let mut status = Status::default();
        status.refresh_own();
        assert!(status.rss_bytes.unwrap() > 0);
        assert!(status.cpu_seconds.is_some());
        assert!(status.heap_in_use_bytes > 0);
    }
}
