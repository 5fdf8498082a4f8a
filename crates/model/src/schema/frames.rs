//! Frames and how a stack was found: a resolved frame ([`FrameInfo`]), how the stack was
//! unwound and why its walk ended. What unwinds and resolves them is allocscope-target's `stacks`.

use std::sync::Arc;

/// A resolved frame. One return address can resolve to several (inlined calls).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FrameInfo {
    /// Function name, demangled; `None` when unknown.
    pub function: Option<Arc<str>>,
    /// Path of the module (executable or library) as the process mapped it.
    pub module: Option<Arc<str>>,
    /// Source file, when debug info has it.
    pub file: Option<Arc<str>>,
    /// Source line, when debug info has it.
    pub line: Option<u32>,
    /// File offset of the return address in the module (or the raw address when unmapped;
    /// 0 for a Python frame).
    pub address: u64,
    /// What kind of frame: absent for native code, `python` for a Python function (its
    /// `function` is the qualified name, `file` and `line` the source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<FrameKind>,
}

/// [`FrameInfo::kind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameKind {
    /// A Python function.
    Python,
}

/// Why a walk ended.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum StackEnd {
    /// At the outermost frame (`_start`, a thread's start): the stack is whole.
    Root,
    /// The walk ended without knowing whether it reached the root (the kernel's
    /// frame-pointer walk stops at a zero frame pointer, which is both).
    Unknown,
    /// The stack continues beyond the bytes copied (`--stack-bytes`).
    Window,
    /// A frame was not a return address (no call instruction before it): it and the rest
    /// were dropped.
    NotAReturnAddress,
    /// A frame lies in no file-backed executable mapping (JIT code, an unmapped address).
    Unmapped,
    /// The unwinder could not go on (no CFI and no frame pointer for a frame).
    UnwindFailed,
    /// allocscope-target's `stacks::unwind::MAX_FRAMES` (or, for the kernel's walk, its depth
    /// limit) reached.
    Depth,
}

impl StackEnd {
    /// Whether the stack is known to be cut short (frames above it are missing).
    pub fn is_truncated(self) -> bool {
        !matches!(self, StackEnd::Root | StackEnd::Unknown)
    }

    /// What a reader is told about a stack cut this way.
    pub fn describe(self) -> &'static str {
        match self {
            StackEnd::Root => "reached their root",
            StackEnd::Unknown => "ended where the frame-pointer walk did",
            StackEnd::Window => "went beyond the stack copied (--stack-bytes)",
            StackEnd::NotAReturnAddress => "stopped at a frame that was not a return address",
            StackEnd::Unmapped => "stopped at code in no file (JIT, unmapped)",
            StackEnd::UnwindFailed => "stopped where no CFI or frame pointer led on",
            StackEnd::Depth => "were cut at the depth limit",
        }
    }
}

/// How a stack was unwound.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Unwinding {
    /// From a copy of the stack, with the modules' CFI (`--unwind dwarf`).
    Dwarf,
    /// By the kernel, along frame pointers (`--unwind fp`).
    FramePointers,
    /// By a Go runtime's own traceback, as its heap profile keeps it (read from outside,
    /// no probe): an inlined call's caller's own entry is left out, the caller's frame
    /// expanded from the call's return address as for any other stack.
    GoRuntime,
}
