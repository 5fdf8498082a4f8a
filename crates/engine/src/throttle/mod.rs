//! The sampling-rate throttle (`--max-samples-per-sec`, after JFR's throttler), the whole
//! feature: the controller ([`controller`], pure) and its state in a recording
//! ([`Throttling`]: what it saw, the changes it made, for the profile).
//!
//! Why: a malloc storm at a small interval must not flood the ring buffer, the unwinder or the
//! symbolizer. Once a second the controller sets the mean interval for the next second:
//!
//! * feed-forward: the interval that would give the target rate at the allocation rate
//!   expected next (`interval = bytes/s ÷ target`): the exact bytes per second, taken at
//!   once when they rise (a storm is answered within a second), smoothed (EWMA) when they
//!   fall;
//! * integral correction: samples do not follow bytes exactly (an object larger than the
//!   interval is sampled once, however large), so the log-ratio of the samples seen to the
//!   target is accumulated, near the operating point only, and scales the interval;
//! * never below the user's `--interval`, and changed only by more than 20% (a changed
//!   interval takes effect at each thread's next sample);
//! * without `--interval`, a band rather than a ceiling (`--min-samples-per-sec`): a quiet
//!   process, which at 512 KiB would give a handful of samples a minute and bounds too
//!   wide to read, has its interval lowered (down to [`SMALLEST_INTERVAL`], at most 16× a
//!   second) until it gives the minimum; a second with nothing allocated changes nothing.
//!   Samples cost microseconds each, so the minimum costs next to nothing (200 a second:
//!   ~0.1% of a core).
//!
//! The kernel draws each countdown at the interval in force and every sample carries the
//! interval its countdown was drawn at; the countdown is memoryless, so a change mid-way
//! leaves every estimator unbiased (the simulation in `stats::simulate`, feature
//! `simulation`, checks it with a step change).

mod controller;
mod in_recording;

pub(crate) use controller::SMALLEST_INTERVAL;
pub(crate) use in_recording::Throttling;
