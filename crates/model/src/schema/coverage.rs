//! How completely a process was observed: from when (its start, a fork, an exec, or our
//! attaching) and which allocator files were probed late.

use serde::{Deserialize, Serialize};

use super::ProcessProfile;

/// How completely a process's allocations were observed (see docs/json-schema.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Coverage {
    /// From when: `fork` or `exec` (the kernel counted it from that event on, before it
    /// ran: `--follow`, `--comm`), `start` (the command allocscope started, from its
    /// exec), `attach` (running before the recording: from when it was attached), or
    /// `unknown` (its fork event was lost, so its start was not seen).
    pub since: CoverageStart,
    /// Allocator files it used that were probed only this long after `since`: calls
    /// through them before then were not seen. Empty: nothing was missed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub late: Vec<LateAllocator>,
    /// False when it was gone before its mappings could be read: what went through files
    /// already probed was seen, whether it used another allocator is unknown.
    pub checked: bool,
}

impl Coverage {
    /// Whether every allocation since `since` was seen (as far as could be checked).
    pub fn complete(&self) -> bool {
        self.late.is_empty() && self.checked
    }
}

/// See [`Coverage::since`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoverageStart {
    /// Followed from its fork, before it ran.
    Fork,
    /// Followed (or taken in by `--comm`) from its exec, before its program ran.
    Exec,
    /// The command allocscope started, from its exec.
    Start,
    /// Running before: from when it was attached.
    #[default]
    Attach,
    /// Its fork event was lost.
    Unknown,
}

/// An allocator file probed after a process began (see [`Coverage::late`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LateAllocator {
    /// The allocator ("jemalloc (/usr/lib/…/libjemalloc.so.2)").
    pub allocator: String,
    /// How long after the process's `since` (or its exec, with `after_exec`) its probes
    /// were in, in milliseconds.
    pub after_ms: f64,
    /// Counted from an exec of a new program (its probes attached anew), not from `since`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_exec: bool,
}

impl ProcessProfile {
    /// Whether the process was followed from its beginning (the command started, a fork,
    /// an exec), so its live numbers hold all it allocated, not what it did since attach.
    pub fn seen_from_its_start(&self) -> bool {
        matches!(
            self.coverage.as_ref().map(|c| c.since),
            Some(CoverageStart::Start | CoverageStart::Fork | CoverageStart::Exec)
        )
    }
}
