//! Conditions a test awaits instead of sleeping for a guessed time: a line in allocscope's
//! log, a process's children, the CPU time a process has run. A fixed sleep is either too
//! short on a loaded CI machine (a flake) or longer than needed everywhere.

use std::{
    io::{BufRead as _, BufReader},
    process::ChildStderr,
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

/// allocscope's stderr read on a thread line by line (so it never blocks on a full pipe):
/// a test can await a line, and gets the whole text at the end.
pub struct LogWatch {
    text: Arc<Mutex<String>>,
    thread: JoinHandle<()>,
}

impl LogWatch {
    /// Starts reading `stderr` (as [`crate::start_recording`] returns it).
    pub fn start(mut stderr: BufReader<ChildStderr>) -> LogWatch {
        let text = Arc::new(Mutex::new(String::new()));
        let shared = Arc::clone(&text);
        let thread = std::thread::spawn(move || loop {
            let mut line = String::new();
            match stderr.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => shared.lock().unwrap().push_str(&line),
            }
        });
        LogWatch { text, thread }
    }

    /// Waits, for at most `timeout`, until a line read so far satisfies `wanted`.
    pub fn wait_for(&self, timeout: Duration, wanted: impl Fn(&str) -> bool) -> bool {
        crate::wait_until(timeout, || self.text.lock().unwrap().lines().any(&wanted))
    }

    /// The whole text, once the process closed its stderr (exited).
    pub fn join(self) -> String {
        let _ = self.thread.join();
        Arc::try_unwrap(self.text)
            .map(|m| m.into_inner().unwrap())
            .unwrap_or_else(|shared| shared.lock().unwrap().clone())
    }
}

/// The children of `pid` now (`/proc/PID/task/*/children`: those any of its threads forked).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    threads
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The CPU time `pid` has used (all its threads); zero once it is gone.
pub fn cpu_time(pid: u32) -> Duration {
    allocscope_target::sys::clock::process_cpu_ns(pid).map_or(Duration::ZERO, Duration::from_nanos)
}

/// Waits, for at most `timeout`, until `pid` has run `cpu` more on the CPU than it had when
/// called: the work a test wants recorded, done.
pub fn until_it_ran(pid: u32, cpu: Duration, timeout: Duration) -> bool {
    let start = cpu_time(pid);
    crate::wait_until(timeout, || cpu_time(pid).saturating_sub(start) >= cpu)
}
