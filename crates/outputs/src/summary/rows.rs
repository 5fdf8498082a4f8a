//! What a summary table's row is of: one process's stack ([`StackProfile`]), or one
//! command's processes' alike stacks taken together ([`CommandStackProfile`], whose frames
//! are those of the profile's stack it names). The tables are written once for both.

use crate::{
    schema::{CommandStackProfile, FrameInfo, LifetimeValues, Profile, StackProfile},
    stats::Estimate,
    text,
};

/// Whose a table row is: rows of one owner that read alike are told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner<'a> {
    Process(u32),
    Command(&'a str),
}

/// What a table shows of a stack: one process's ([`StackProfile`]), or one command's
/// processes' taken together ([`CommandStackProfile`], as a [`CommandRow`]).
pub(crate) trait Row {
    fn frames(&self) -> &[FrameInfo];
    fn owner(&self) -> Owner<'_>;
    /// `pid 42`, or `sort ×300` (the processes of a command with samples on it).
    fn who(&self) -> String;
    fn samples(&self) -> u64;
    fn alloc_bytes(&self) -> &Estimate;
    /// Bytes live at the end (`None`: frees not tracked).
    fn inuse_bytes(&self) -> Option<Estimate>;
    /// Bytes live at each process's peak (`None`: frees not tracked).
    fn peak_bytes(&self) -> Option<Estimate>;
    fn lifetimes(&self) -> Option<&LifetimeValues>;
    /// The lost samples' pseudo-stack, not a call stack.
    fn lost(&self) -> bool;
}

impl Row for StackProfile {
    fn frames(&self) -> &[FrameInfo] {
        &self.frames
    }
    fn owner(&self) -> Owner<'_> {
        Owner::Process(self.pid)
    }
    fn who(&self) -> String {
        format!("pid {}", self.pid)
    }
    fn samples(&self) -> u64 {
        self.samples
    }
    fn alloc_bytes(&self) -> &Estimate {
        &self.alloc_bytes
    }
    fn inuse_bytes(&self) -> Option<Estimate> {
        self.inuse_bytes
    }
    fn peak_bytes(&self) -> Option<Estimate> {
        self.peak_bytes
    }
    fn lifetimes(&self) -> Option<&LifetimeValues> {
        self.lifetimes.as_ref()
    }
    fn lost(&self) -> bool {
        self.lost
    }
}

/// A command's stack as a row: with the frames of the stack it names.
pub(crate) struct CommandRow<'a> {
    stack: &'a CommandStackProfile,
    frames: &'a [FrameInfo],
}

/// The profile's command stacks as rows (one naming no stack of the profile left out).
pub(super) fn command_rows(profile: &Profile) -> Vec<CommandRow<'_>> {
    profile
        .command_stacks
        .iter()
        .filter_map(|stack| {
            let frames = &profile.stacks.get(stack.stack)?.frames;
            Some(CommandRow { stack, frames })
        })
        .collect()
}

impl Row for CommandRow<'_> {
    fn frames(&self) -> &[FrameInfo] {
        self.frames
    }
    fn owner(&self) -> Owner<'_> {
        Owner::Command(&self.stack.command)
    }
    fn who(&self) -> String {
        let name = text::printable(&self.stack.command);
        if self.stack.processes == 1 {
            format!("{name} (pid {})", self.stack.largest_pid)
        } else {
            format!("{name} ×{}", self.stack.processes)
        }
    }
    fn samples(&self) -> u64 {
        self.stack.samples
    }
    fn alloc_bytes(&self) -> &Estimate {
        &self.stack.alloc_bytes
    }
    fn inuse_bytes(&self) -> Option<Estimate> {
        self.stack.inuse_bytes
    }
    fn peak_bytes(&self) -> Option<Estimate> {
        self.stack.peak_bytes
    }
    fn lifetimes(&self) -> Option<&LifetimeValues> {
        self.stack.lifetimes.as_ref()
    }
    fn lost(&self) -> bool {
        self.stack.lost
    }
}
