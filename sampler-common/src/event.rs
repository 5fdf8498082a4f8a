//! Wire formats shared by kernel and user side: map values and ring-buffer records.
//!
//! All structs are `#[repr(C)]`, `Copy`, 8-byte aligned (the ring buffer reserves on 8-byte
//! boundaries) and contain no padding the kernel could leave uninitialized.

/// Where the kernel maps its uprobe area (whose first slot is the return trampoline) on
/// x86-64: `TASK_SIZE - PAGE_SIZE` with 47-bit user addresses. Another tool's return probe
/// (or a uprobe session that filtered this process out: the kernel still arms its return)
/// can put the trampoline in the return slot of a function whose return we did not ask
/// for; a tail-called malloc then sees it as its caller. User space checks the address in
/// the targets' maps (`[uprobes]`).
pub const UPROBE_TRAMPOLINE: u64 = 0x7fff_ffff_e000;

/// Maximum number of user frames captured per sample by the kernel's frame-pointer walk
/// (`--unwind fp`): 127 frames (1016 bytes) keep such a record near 1 KiB.
pub const MAX_STACK_DEPTH: usize = 127;

/// The page size the stack copy reads in (`--unwind dwarf`): a page either is mapped or is
/// not, so reading page by page stops exactly at the top of the stack.
pub const STACK_PAGE: usize = 4096;

/// Most bytes of user stack copied per sample (`--unwind dwarf`, `--stack-bytes`): the
/// payload of a [`SampleRecord`].
pub const MAX_STACK_COPY: usize = 64 * 1024;

/// Capacity of the per-target exact counters: the most processes one session probes.
pub const MAX_TARGETS: u32 = 1024;

/// Allocator entry points probed. The discriminant is sent in [`AllocEvent::function`] and
/// indexes per-function tables (e.g. the function sizes used for nesting detection).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocFn {
    /// `malloc(size)`
    Malloc = 0,
    /// `calloc(nmemb, size)`: allocates `nmemb * size` bytes.
    Calloc = 1,
    /// `realloc(ptr, size)`: counted as an allocation of `size` bytes.
    Realloc = 2,
    /// `posix_memalign(&ptr, align, size)`
    PosixMemalign = 3,
    /// `aligned_alloc(align, size)`
    AlignedAlloc = 4,
    /// `memalign(align, size)`
    Memalign = 5,
    /// `valloc(size)`
    Valloc = 6,
    /// `pvalloc(size)`
    Pvalloc = 7,
    /// C++ `operator new(size, …)` and `new[]`, and the other entry points that take the size
    /// first and may reach a probed `malloc` (jemalloc's `mallocx`, mimalloc's `mi_zalloc`).
    New = 8,
}

impl AllocFn {
    /// Number of probed functions (length of per-function tables).
    pub const COUNT: usize = 9;

    /// Length of per-function tables in the kernel: a power of two at least [`Self::COUNT`],
    /// so an index masked with `FUNCTION_SLOTS - 1` is provably in range.
    pub const FUNCTION_SLOTS: usize = 16;

    /// Every probed function, in discriminant order.
    pub const ALL: [AllocFn; Self::COUNT] = [
        AllocFn::Malloc,
        AllocFn::Calloc,
        AllocFn::Realloc,
        AllocFn::PosixMemalign,
        AllocFn::AlignedAlloc,
        AllocFn::Memalign,
        AllocFn::Valloc,
        AllocFn::Pvalloc,
        AllocFn::New,
    ];

    /// The C symbol name of the function.
    pub const fn symbol(self) -> &'static str {
        match self {
            AllocFn::Malloc => "malloc",
            AllocFn::Calloc => "calloc",
            AllocFn::Realloc => "realloc",
            AllocFn::PosixMemalign => "posix_memalign",
            AllocFn::AlignedAlloc => "aligned_alloc",
            AllocFn::Memalign => "memalign",
            AllocFn::Valloc => "valloc",
            AllocFn::Pvalloc => "pvalloc",
            AllocFn::New => "operator new",
        }
    }

    /// Decodes the discriminant sent by the kernel side.
    pub const fn from_u32(value: u32) -> Option<AllocFn> {
        if (value as usize) < Self::COUNT {
            Some(Self::ALL[value as usize])
        } else {
            None
        }
    }

    /// The arguments (0-based) the probe reads: the size, the pointer of `realloc` and
    /// `posix_memalign`, and `calloc`'s two factors.
    pub const fn arguments(self) -> &'static [usize] {
        match self {
            AllocFn::Malloc | AllocFn::Valloc | AllocFn::Pvalloc | AllocFn::New => &[0],
            AllocFn::Calloc | AllocFn::Realloc => &[0, 1],
            AllocFn::PosixMemalign => &[0, 2],
            AllocFn::AlignedAlloc | AllocFn::Memalign => &[1],
        }
    }

    /// Functions that may call `malloc` internally (glibc: realloc(NULL, n) and the memalign
    /// family with small alignments tail-call or call `__libc_malloc`; jemalloc 5.2's
    /// `operator new` calls its `malloc`). Their entry leaves a marker in [`ThreadState`] so
    /// the nested `malloc` is not counted a second time. Only `malloc` checks the marker:
    /// the (stack pointer, return address) pair then identifies the outer call exactly, as
    /// no other call site can reach `malloc` with the same pair. A probed function that
    /// merely jumps to another one (jemalloc's `new[]` to `new`) is not probed at all
    /// (`probe::allocator`).
    pub const fn may_nest_malloc(self) -> bool {
        !matches!(self, AllocFn::Malloc | AllocFn::Calloc)
    }
}

/// What a ring-buffer record is (its first field).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// An [`AllocEvent`].
    Alloc = 1,
    /// A [`FreeEvent`].
    Free = 2,
    /// A [`ProcessEvent`].
    Process = 3,
    /// A [`crate::python::PyStackRecord`] (the Python frames of the sample after it).
    PythonStack = 4,
    /// A [`GoStatsEvent`].
    GoStats = 5,
}

/// [`ProcessEvent::what`]: a followed process forked a new process (`pid`, from `parent`).
pub const PROCESS_FORK: u32 = 1;
/// [`ProcessEvent::what`]: a followed process (`pid`) exec'd a new program.
pub const PROCESS_EXEC: u32 = 2;

/// The attach cookie (counter slot) of probes attached to every process (`--all`): their
/// calls are counted per process in a hash keyed by pid instead of an array slot.
pub const HOST_SLOT: u32 = u32::MAX;

/// Value of a `FOLLOWED` entry: a target, counted and sampled by file-wide probes
/// (`--follow`, `--comm`), whose new processes are targets too.
pub const FOLLOWED_TARGET: u8 = 1;

/// Value of a `FOLLOWED` entry: a process that exec'd while `--comm` looks for new
/// targets, counted and sampled from its first instruction until user space, which runs
/// the name pattern, either makes it a target or drops it with what it sent.
pub const FOLLOWED_PENDING: u8 = 2;

/// A followed process forked or exec'd (`--follow`, `--comm`): user space decides and
/// notes how it is covered.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessEvent {
    /// [`EventKind::Process`].
    pub kind: u32,
    /// [`PROCESS_FORK`] or [`PROCESS_EXEC`].
    pub what: u32,
    /// The new (or exec'ing) process.
    pub pid: u32,
    /// The forking process (0 for an exec).
    pub parent: u32,
    /// `bpf_ktime_get_ns()` at the event.
    pub timestamp_ns: u64,
    /// The process's name then (`comm`, NUL-padded; a new process's is its parent's): what
    /// `--comm` matches, known even if the process is gone before user space looks.
    pub comm: [u8; 16],
}

/// The most bytes of a Go runtime's statistics read at its process's exit
/// ([`GoStatsEvent::bytes`]; go1.19's ring of three deltas is 3,528).
pub const GO_STATS_MAX: usize = 8192;

/// Where a Go process keeps its runtime's allocation statistics (`runtime.memstats`'s
/// ring of `heapStatsDelta`): read by the exit probe when its last thread exits, before
/// its memory is gone (user space reads them while it lives).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoStatsAt {
    /// The statistics' user address.
    pub address: u64,
    /// `runtime.MemProfileRate`'s user address (0: not read).
    pub rate_address: u64,
    /// How many bytes to read (at most [`GO_STATS_MAX`]).
    pub len: u32,
    /// Explicit padding.
    pub pad: u32,
}

/// [`GoStatsEvent::moment`]: read as the process's last thread exited.
pub const GO_STATS_AT_EXIT: u32 = 0;
/// [`GoStatsEvent::moment`]: read as the process exec'd another program, past the point of
/// no return, its old program's memory still there.
pub const GO_STATS_AT_EXEC: u32 = 1;

/// A Go process's runtime statistics as its exit, or an exec, left them ([`GoStatsAt`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GoStatsEvent {
    /// [`EventKind::GoStats`].
    pub kind: u32,
    /// The process.
    pub pid: u32,
    /// Bytes read into [`Self::bytes`] (0: the read failed).
    pub len: u32,
    /// When they were read: [`GO_STATS_AT_EXIT`] or [`GO_STATS_AT_EXEC`].
    pub moment: u32,
    /// `bpf_ktime_get_ns()` at the exit or exec.
    pub timestamp_ns: u64,
    /// `runtime.MemProfileRate` then (`u64::MAX`: not read).
    pub rate: u64,
    /// The statistics' bytes.
    pub bytes: [u8; GO_STATS_MAX],
}

/// [`AllocEvent::flags`]: the stack was taken at the allocator's return, so `stack[0]` is
/// the direct caller's return address (not the allocator's entry).
pub const FLAG_STACK_AT_RETURN: u32 = 1;
/// [`AllocEvent::flags`]: `address` was recorded in the live map; a [`FreeEvent`] will
/// report its free.
pub const FLAG_TRACKED: u32 = 2;
/// [`AllocEvent::flags`]: the payload is a copy of the user stack from [`StackCopy::start`]
/// (`--unwind dwarf`), not frame-pointer return addresses.
pub const FLAG_STACK_COPY: u32 = 4;
/// [`AllocEvent::flags`]: another program's allocator sampled the block and stated the
/// bytes it stands for (`otel_memory:alloc`'s weight), which [`AllocEvent::interval`] then
/// holds; [`AllocEvent::offset`] is unknown (0).
pub const FLAG_WEIGHTED: u32 = 8;
/// [`AllocEvent::flags`]: a language runtime's own sampler drew the block (Go's per-P
/// countdown over allocated bytes, restarted after each sample) at the mean rate
/// [`AllocEvent::interval`] then holds; [`AllocEvent::offset`] is unknown (0). User space
/// weighs it by its inclusion probability (`size / (1 - e^(-size/rate))`).
pub const FLAG_RUNTIME_RATE: u32 = 32;

/// One sampled allocation: the head of each sample's ring-buffer record, which continues
/// with a [`StackCopy`] and `stack_len` payload entries ([`SampleRecord`] without its unused
/// tail). Only sampled calls produce one.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AllocEvent {
    /// [`EventKind::Alloc`].
    pub kind: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// `bpf_ktime_get_ns()` at the probe (CLOCK_MONOTONIC).
    pub timestamp_ns: u64,
    /// Requested size in bytes (n of the sampling model).
    pub size: u64,
    /// 0-based offset of the byte whose Bernoulli trial succeeded (the countdown before this
    /// allocation), always `< size`.
    pub offset: u64,
    /// Mean sampling interval (1/p) in force when this sample was drawn.
    pub interval: u64,
    /// The return address at `[rsp]` on entry: the direct caller, which frame-pointer walking
    /// from an entry probe misses (docs/design.md §3).
    pub return_address: u64,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Length of the payload: return addresses (u64) from the frame-pointer walk, or bytes
    /// of stack copied ([`FLAG_STACK_COPY`]).
    pub stack_len: u32,
    /// [`AllocFn`] discriminant.
    pub function: u32,
    /// The address returned (0 while frees are not tracked, or when the allocation failed).
    pub address: u64,
    /// The allocating thread's name then (`comm`, NUL-padded): known even when the thread
    /// is gone before user space could look.
    pub comm: [u8; 16],
}

/// The registers an unwinder starts from and where the copied stack begins
/// ([`FLAG_STACK_COPY`]; zero otherwise).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackCopy {
    /// Instruction pointer when the stack was taken: the probed instruction at an entry,
    /// the direct caller's return address at a return.
    pub ip: u64,
    /// Stack pointer then.
    pub sp: u64,
    /// Frame pointer register then (`rbp`; a frame pointer only where code keeps one).
    pub bp: u64,
    /// User address of the payload's first byte (`sp`).
    pub start: u64,
    /// The thread's latest return slots ([`ThreadState::return_slots`]), for an unwinder
    /// that meets the kernel's uretprobe trampoline in one of them.
    pub return_slots: [u64; RETURN_SLOTS],
    /// The return addresses they held at their function's entry.
    pub return_values: [u64; RETURN_SLOTS],
    /// How many were recorded in all: the newest is at `(return_next - 1) % RETURN_SLOTS`.
    pub return_next: u64,
}

/// A sample's whole ring-buffer record, as assembled in the kernel's per-CPU scratch space.
/// Only the head and the used part of the payload are sent.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SampleRecord {
    /// What was sampled.
    pub event: AllocEvent,
    /// Registers and stack origin of a stack copy.
    pub copy: StackCopy,
    /// `bpf_get_stack(BPF_F_USER_STACK)` return addresses (`[0]` the probed instruction or,
    /// at a return, the direct caller), or the copied user stack.
    pub payload: [u8; MAX_STACK_COPY],
}

impl SampleRecord {
    /// Bytes before the payload.
    pub const HEAD: usize = core::mem::size_of::<AllocEvent>() + core::mem::size_of::<StackCopy>();
}

/// A tracked (sampled) allocation was freed, by `free` or a successful `realloc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FreeEvent {
    /// [`EventKind::Free`].
    pub kind: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// `bpf_ktime_get_ns()` at the free.
    pub timestamp_ns: u64,
    /// The address freed.
    pub address: u64,
}

/// Key of the live map: a sampled allocation still in use.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveKey {
    /// Process id (pointers repeat across processes).
    pub pid: u32,
    /// Explicit padding (kept zero: the kernel hashes every key byte).
    pub pad: u32,
    /// The allocation's address.
    pub address: u64,
}

/// Key of the lost-sample map: samples drawn but never delivered (the ring buffer was
/// full), grouped by what their estimate needs. A lost sample still counts: its process's
/// totals and bounds include it (under a "samples lost" pseudo-stack), only its stack is
/// unknown.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LostKey {
    /// Process id.
    pub pid: u32,
    /// Explicit padding (kept zero: the kernel hashes every key byte).
    pub pad: u32,
    /// Size of the sampled allocations.
    pub size: u64,
    /// Mean interval they were drawn under.
    pub interval: u64,
}

/// Value of the lost-sample map, one copy per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LostSamples {
    /// How many samples were lost.
    pub samples: u64,
    /// Sum of their remainders `size - offset` (the bytes after each sampled byte).
    pub unseen: u64,
}

/// Exact per-process counters, one copy per CPU (summed by user space).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessCounters {
    /// Allocation calls seen (nested calls excluded).
    pub calls: u64,
    /// Bytes requested by those calls.
    pub bytes: u64,
}

/// Per-thread sampling state, kept in an LRU map keyed by tid (bounded: thread churn evicts
/// old entries, and discarding a countdown is legal because the eviction does not depend on
/// its value).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadState {
    /// Failed Bernoulli trials (bytes) left before the next sampled byte.
    pub countdown: u64,
    /// The mean interval `countdown` was drawn at: the sample it ends carries it (the
    /// throttle may have changed the interval since; geometric countdowns are memoryless,
    /// so each sample's own interval keeps every estimate unbiased).
    pub interval: u64,
    /// The allocator function this thread is inside, if one that may call another probed
    /// one was entered: the nested call is then not counted again.
    pub marker: NestingMarker,
    /// A sampled call waiting for its return (frees tracked).
    pub pending: PendingSample,
    /// Return addresses the kernel's trampolines replaced (frees tracked).
    pub returns: ReturnSlots,
    /// The block a Go runtime's sweeper is freeing the specials of on this thread
    /// (`runtime.freeSpecial(s, p, size)`): its `mProf_Free` says it was a sampled one.
    pub freeing: u64,
    /// The block of this thread's last runtime sample (`runtime.mProf_Malloc`): the same
    /// call entered again (a signal that interrupted the probe's single-step restarts the
    /// instruction; a goroutine's stack growth restarts the function) is not a new sample.
    pub runtime_last: u64,
}

/// The entry of an allocator function that may call another probed one (glibc's
/// `realloc(NULL, n)` tail-calls `malloc`), by which a nested call is recognised.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NestingMarker {
    /// Stack pointer at its entry (0: no marker).
    pub sp: u64,
    /// Return address at that entry.
    pub ret: u64,
    /// Address of that function's probed entry instruction.
    pub ip: u64,
    /// [`AllocFn`] of that function.
    pub function: u64,
    /// Non-zero when that function's return is probed (its return address on the stack is
    /// then the kernel's trampoline, and its return clears the marker).
    pub armed: u64,
}

/// A sampled call waiting for its return (frees tracked): the result is the block's
/// address, known only then.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingSample {
    /// Its interval.
    pub interval: u64,
    /// Its size (0: none pending).
    pub size: u64,
    /// Its sampled offset.
    pub offset: u64,
    /// Its function ([`AllocFn`]).
    pub function: u64,
    /// posix_memalign's `memptr` argument: where the result will be stored.
    pub memptr: u64,
    /// realloc's old pointer, when it is tracked: freed if the realloc succeeds.
    pub free: u64,
    /// realloc's requested size (0 frees the old pointer even though NULL is returned).
    pub realloc_size: u64,
    /// Stack pointer at the entry of the call: its return has `rsp` 8 above.
    pub sp: u64,
}

/// Stack addresses of the return addresses of the latest probed entries (frees tracked
/// only), a ring: where a return probe replaced a return address by the kernel's
/// trampoline (every call with classic return probes, a session another allocscope asked
/// for), the original is in `values`, and the unwinder of a stack copy puts it back.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReturnSlots {
    /// Where the return addresses were.
    pub slots: [u64; RETURN_SLOTS],
    /// The return addresses those slots held at entry.
    pub values: [u64; RETURN_SLOTS],
    /// Entries recorded so far (the ring's write position).
    pub next: u64,
}

/// The sampling rate in force, set by user space (`--max-samples-per-sec`): the interval
/// and its geometric scale ([`crate::geometric::scale_q32`]). All zero: the load-time
/// interval.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rate {
    /// Mean sampling interval in bytes.
    pub interval: u64,
    /// `1 / -ln(1 - 1/interval)` in Q32.32.
    pub scale_q32: u64,
}

/// Entries of the per-thread return-slot ring: how many probed calls deep a trampoline can
/// be put back (an allocator calling another probed one is two).
pub const RETURN_SLOTS: usize = 4;

/// Indices of the per-CPU loss counters: every event or count that could not be recorded.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossCounter {
    /// A sample was drawn but the ring buffer had no room: its stack is lost (its size is
    /// kept in the lost-sample map, or counted in [`LossCounter::LostUnrecorded`]).
    RingBufFull = 0,
    /// A sample was sent without a user stack (bpf_get_stack failed).
    StackMissing = 1,
    /// A probe fired with a target slot outside the counter array: exact counts incomplete.
    CountersFull = 2,
    /// The thread-state map refused an entry: the call was neither counted nor sampled.
    ThreadStateFull = 3,
    /// The live map was full: a sampled allocation's free cannot be tracked.
    LiveMapFull = 4,
    /// A tracked block was freed but the ring buffer had no room for the event: it stays
    /// live in the estimates (live numbers may be high).
    FreeEventLost = 5,
    /// A followed process's fork or exec event found the ring buffer full.
    ProcessEventLost = 6,
    /// A lost sample could not be entered in the lost-sample map (full): a process total
    /// misses it, and says so.
    LostUnrecorded = 7,
    /// The followed set was full: a new process of a followed one (or one `--comm` was to
    /// decide on) is not counted by file-wide probes.
    FollowedFull = 8,
    /// The table of processes carrying an in-process front end was full: file-wide probes
    /// may count such a process's calls that its front end counts too.
    FrontEndFull = 9,
}

impl LossCounter {
    /// Number of loss counters (the size of the per-CPU array).
    pub const COUNT: u32 = 10;
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] integer structs without padding; any bit pattern is valid.
    unsafe impl aya::Pod for super::ProcessCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ThreadState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AllocEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::StackCopy {}
    // SAFETY: as above (a byte array after 8-byte-aligned integers: no padding).
    unsafe impl aya::Pod for super::SampleRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FreeEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcessEvent {}
    // SAFETY: as above (the padding is an explicit field).
    unsafe impl aya::Pod for super::LiveKey {}
    // SAFETY: as above (the padding is an explicit field).
    unsafe impl aya::Pod for super::LostKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LostSamples {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Rate {}
    // SAFETY: as above (the padding is an explicit field).
    unsafe impl aya::Pod for super::GoStatsAt {}
    // SAFETY: as above (an i64 then four bytes and explicit padding: 16 bytes, no gap).
    unsafe impl aya::Pod for crate::usdt::UsdtArgument {}
    // SAFETY: as above (three 16-byte arguments then two u32s: no gap).
    unsafe impl aya::Pod for crate::usdt::UsdtSpec {}
}
