//! The recording's intake: the ring buffer's reader, the batch of events it reads, the eBPF
//! programs' log (`-v`), and the cutoff after which nothing is taken in.
//!
//! Why its own component: what comes in is decided in one place. Once detaching, samples and
//! frees after the cutoff are dropped, so that the profile covers exactly what the final
//! counters cover (removing a breakpoint takes the kernel milliseconds, and the probes still
//! fire meanwhile); every other component receives events already cut.

use log::warn;

use super::Logger;
use crate::collect::{Event, SampleReader};

/// Events as they come in, until the cutoff.
pub(super) struct Intake {
    reader: SampleReader,
    batch: Vec<Event>,
    logger: Option<Logger>,
    /// Samples allocscope's countdown drew, taken in so far (see [`Self::samples`]).
    samples: u64,
    /// Once detaching: events after this moment (CLOCK_MONOTONIC ns) are dropped.
    cutoff_ns: Option<u64>,
}

impl Intake {
    pub(super) fn new(reader: SampleReader, logger: Option<Logger>) -> Intake {
        Intake {
            reader,
            batch: Vec::new(),
            logger,
            samples: 0,
            cutoff_ns: None,
        }
    }

    /// The ring buffer's reader (to have it look at a process's interpreter early).
    pub(super) fn reader(&mut self) -> &mut SampleReader {
        &mut self.reader
    }

    /// Waits for records and reads them into the batch. Cancel-safe.
    pub(super) async fn read(&mut self) -> anyhow::Result<()> {
        self.reader.read(&mut self.batch).await
    }

    /// Reads every record waiting in the ring buffer into the batch.
    pub(super) async fn catch_up(&mut self) -> anyhow::Result<()> {
        self.reader.catch_up(&mut self.batch).await
    }

    /// Adds events read elsewhere (a command's early records).
    pub(super) fn extend(&mut self, events: impl IntoIterator<Item = Event>) {
        self.batch.extend(events);
    }

    /// The batch so far, without what came after the cutoff; its samples counted.
    pub(super) fn take(&mut self) -> Vec<Event> {
        let mut batch = std::mem::take(&mut self.batch);
        if let Some(cutoff) = self.cutoff_ns {
            batch.retain(|event| match event {
                Event::Alloc(sample) => sample.timestamp_ns <= cutoff,
                Event::Free(freed) => freed.timestamp_ns <= cutoff,
                Event::Process { .. }
                | Event::Maps { .. }
                | Event::PythonFrames(_)
                | Event::GoStats { .. } => true,
            });
        }
        self.samples += batch
            .iter()
            .filter(|event| matches!(event, Event::Alloc(sample) if sample.weight.is_none()))
            .count() as u64;
        batch
    }

    /// Samples taken in so far that allocscope's countdown drew, the throttle's to govern:
    /// not a producer's or a Go runtime's, weighed by their own samplers' rates (counted,
    /// a Go program's 10,000 samples a second, against the bytes of calls counted here,
    /// none, had the throttle lower the interval to its floor for nothing).
    pub(super) fn samples(&self) -> u64 {
        self.samples
    }

    /// The cutoff, once detaching.
    pub(super) fn cutoff_ns(&self) -> Option<u64> {
        self.cutoff_ns
    }

    /// Writes out the eBPF programs' log records so far.
    pub(super) fn flush_log(&mut self) {
        if let Some(logger) = self.logger.as_mut() {
            logger.flush();
        }
    }

    /// Detaching: nothing after `ns` is taken in; the log is flushed a last time and closed.
    pub(super) fn cut_off(&mut self, ns: u64) {
        self.cutoff_ns = Some(ns);
        self.flush_log();
        self.logger = None;
    }

    /// Says what the reader had to leave out, if anything.
    pub(super) fn report(&self) {
        if self.reader.malformed() > 0 {
            warn!(
                "{} malformed ring-buffer records ignored",
                self.reader.malformed()
            );
        }
        if self.reader.python_frames_missing() > 0 {
            warn!(
                "{} samples lost their Python frames (their record lost to a full ring \
                 buffer, or their interpreter not yet known): their stacks show the \
                 interpreter's native frames",
                self.reader.python_frames_missing()
            );
        }
    }
}
