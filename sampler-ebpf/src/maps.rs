//! The maps, one per concern. Capacities are defaults; user space may resize the bounded
//! ones with `EbpfLoader::map_max_entries` before loading.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use sampler_common::{
    LiveKey, LossCounter, LostKey, LostSamples, ProcessCounters, SampleRecord, ThreadState,
};

/// `BPF_F_NO_PREALLOC`: the hash maps that fill slowly (one entry per process, per lost
/// stack) allocate entries as they are inserted. Preallocated, their capacity cost time at
/// every start (most of it the per-CPU ones' 16384 × CPUs values), the largest part of
/// `record -- /bin/true`'s time (docs/performance.md, "The in-process front end");
/// allocating on insert costs the rare inserts a little more (docs/performance.md, "Figures
/// quoted from the code").
const NO_PREALLOC: u32 = 1;

/// Sampled allocations → user space. Sized for bursts of ~4000 samples in flight.
#[map]
pub static SAMPLES: RingBuf = RingBuf::with_byte_size(4 * 1024 * 1024, 0);

/// The wake-up flag for a sample's or a free's record: none until the ring buffer holds
/// an eighth of its size, then a forced one. Why: the default wakes the reader whenever
/// it had caught up, which is at almost every sample, and the wake-up is an inter-processor
/// interrupt (an MSR write that traps to the hypervisor in a VM): a cost to the probed
/// thread at every sample, more than the rest of the sample (docs/performance.md, "The
/// in-process front end"). The reader polls on a short timer instead (`collect::POLL_MS`),
/// and is woken early only when a burst could fill the buffer before its next poll.
#[inline(always)]
pub fn wake_flags() -> u64 {
    let held = SAMPLES.query(aya_ebpf::bindings::BPF_RB_AVAIL_DATA as u64);
    let size = SAMPLES.query(aya_ebpf::bindings::BPF_RB_RING_SIZE as u64);
    if held >= size / 8 {
        aya_ebpf::bindings::BPF_RB_FORCE_WAKEUP as u64
    } else {
        aya_ebpf::bindings::BPF_RB_NO_WAKEUP as u64
    }
}

/// tid → sampling countdown and nesting marker. LRU: bounded under thread churn.
#[map]
pub static THREADS: LruHashMap<u32, ThreadState> = LruHashMap::with_max_entries(65536, 0);

/// target slot (the uprobe's attach cookie) → exact calls and bytes, one copy per CPU so the
/// hot path never contends. An array indexed by the cookie costs a bounds check, where a
/// hash keyed by pid would cost a hash and a bucket walk on every call.
#[map]
pub static COUNTERS: PerCpuArray<ProcessCounters> =
    PerCpuArray::with_max_entries(sampler_common::MAX_TARGETS, 0);

/// pid → exact calls and bytes of a process probed through host-wide probes (`--all`,
/// cookie [`sampler_common::HOST_SLOT`]), one copy per CPU.
#[map]
pub static HOST_COUNTERS: PerCpuHashMap<u32, ProcessCounters> =
    PerCpuHashMap::with_max_entries(16384, NO_PREALLOC);

/// pids the host-wide probes must ignore (`--exclude-*`, allocscope itself).
#[map]
pub static EXCLUDED: HashMap<u32, u8> = HashMap::with_max_entries(4096, NO_PREALLOC);

/// pids followed through fork (`--follow`): their new processes are followed too.
#[map]
pub static FOLLOWED: HashMap<u32, u8> = HashMap::with_max_entries(65536, NO_PREALLOC);

/// pids carrying an in-process front end (allocscope's library, from its `ready` probe or
/// user space; another producer, from user space): file-wide probes of the functions it
/// serves leave their calls to it. Inherited at fork, dropped at exec and exit.
#[map]
pub static FRONT_END: HashMap<u32, u8> = HashMap::with_max_entries(65536, NO_PREALLOC);

/// Code size of each probed function (by AllocFn): the largest over the probed allocators,
/// updated by user space as allocators are found, for recognizing a call nested in it.
#[map]
pub static FUNCTION_SIZES: Array<u64> =
    Array::with_max_entries(sampler_common::AllocFn::FUNCTION_SLOTS as u32, 0);

/// (pid, address) → allocation time: sampled allocations not yet freed. A free looks its
/// pointer up here: one failed lookup for the unsampled majority. Sized by user space
/// (`--max-tracked`); a full map counts `LiveMapFull`. Preallocated: every sample inserts
/// and every tracked free deletes, and allocating on insert (with its memory-cgroup
/// charge, and the deletion's deferred release) was a quarter of a Go sample's probe time
/// (perf); its 65,536 entries (~5 MiB of kernel memory) cost no measurable start-up time.
#[map]
pub static LIVE: HashMap<LiveKey, u64> = HashMap::with_max_entries(65536, 0);

/// (pid, size, interval) → samples lost because the ring buffer was full, and their
/// remainders, one copy per CPU: enough for user space to add them to their process's
/// estimates exactly as if they had arrived (without a stack). Written only on a loss.
#[map]
pub static LOST: PerCpuHashMap<LostKey, LostSamples> =
    PerCpuHashMap::with_max_entries(16384, NO_PREALLOC);

/// [`LossCounter`] index → number of events or counts lost, per CPU.
#[map]
pub static LOSSES: PerCpuArray<u64> = PerCpuArray::with_max_entries(LossCounter::COUNT, 0);

/// One sample record under assembly per CPU (index: the CPU): header and stack, sent with
/// its used length. Not a per-CPU array, whose values are limited to 32 KiB. User space
/// sizes it to the number of possible CPUs.
#[map]
pub static SCRATCH: Array<SampleRecord> = Array::with_max_entries(1, 0);

/// The sampling rate in force (one entry): set by user space's throttle; zero until then
/// (the load-time interval).
#[map]
pub static RATE: Array<sampler_common::Rate> = Array::with_max_entries(1, 0);

/// Duty cycling (`--max-overhead`): non-zero while an on slot is open (one entry, set by
/// user space). Read only when `DUTY_CYCLED`.
#[map]
pub static GATE: Array<u32> = Array::with_max_entries(1, 0);

/// Argument locations of other programs' USDT allocation probes (`otel_memory`, `ddheap`):
/// index → spec, the index given in each site's attach cookie. Set by user space before it
/// attaches the sites.
#[map]
pub static USDT_SPECS: Array<sampler_common::usdt::UsdtSpec> =
    Array::with_max_entries(sampler_common::usdt::MAX_SPECS, 0);

/// pid → how to walk its interpreter's frames (set by user space when it finds CPython in
/// the process). LRU: bounded, and a process that exited needs no removal.
#[map]
pub static PY_PROCESSES: LruHashMap<u32, sampler_common::python::PyLayout> =
    LruHashMap::with_max_entries(4096, 0);

/// One Python-frames record under assembly per CPU.
#[map]
pub static PY_SCRATCH: PerCpuArray<sampler_common::python::PyStackRecord> =
    PerCpuArray::with_max_entries(1, 0);

/// One frame's first words, per CPU (read at once, then picked apart).
#[map]
pub static PY_FRAME_SCRATCH: PerCpuArray<[u64; sampler_common::python::PY_FRAME_WORDS]> =
    PerCpuArray::with_max_entries(1, 0);

/// pid → where its Go runtime keeps its allocation statistics, read when it exits (set by
/// user space for a Go process whose layout it knows). LRU: bounded.
#[map]
pub static GO_STATS: LruHashMap<u32, sampler_common::GoStatsAt> =
    LruHashMap::with_max_entries(4096, 0);

/// Calls seen by the bare reference probe of the benchmark (index 0).
#[map]
pub static BARE_CALLS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Adds one to a loss counter.
#[inline(always)]
pub fn count_loss(counter: LossCounter) {
    if let Some(slot) = LOSSES.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe { *slot += 1 };
    }
}
