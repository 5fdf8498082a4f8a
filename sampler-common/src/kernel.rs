//! The contract between the eBPF object and the user side, by name: the maps, programs and
//! configuration globals the user side looks up in the loaded object. The eBPF crate's
//! `#[map]`, `#[uprobe]` and `#[no_mangle] static` items carry these names (an attribute
//! needs a literal, so they are spelled there once more); the user side uses only these
//! constants, and its unit test `the_object_has_exactly_the_contracts_names` parses the
//! built object and fails on any name missing on either side.

/// Map names.
pub mod maps {
    /// Ring buffer of samples, frees and process events.
    pub const SAMPLES: &str = "SAMPLES";
    /// Per-thread countdown state.
    pub const THREADS: &str = "THREADS";
    /// Exact per-process counters by counter slot.
    pub const COUNTERS: &str = "COUNTERS";
    /// Exact per-process counters by pid (host-wide and followed modes).
    pub const HOST_COUNTERS: &str = "HOST_COUNTERS";
    /// Processes the programs ignore (host mode).
    pub const EXCLUDED: &str = "EXCLUDED";
    /// The followed set (`--follow`, `--comm`).
    pub const FOLLOWED: &str = "FOLLOWED";
    /// pids carrying an in-process front end (file-wide probes leave their calls to it).
    pub const FRONT_END: &str = "FRONT_END";
    /// Sizes of the probed functions (return-site checks).
    pub const FUNCTION_SIZES: &str = "FUNCTION_SIZES";
    /// Sampled blocks not freed yet.
    pub const LIVE: &str = "LIVE";
    /// Samples lost per stratum.
    pub const LOST: &str = "LOST";
    /// Loss counters ([`crate::LossCounter`]).
    pub const LOSSES: &str = "LOSSES";
    /// One record's scratch space per CPU.
    pub const SCRATCH: &str = "SCRATCH";
    /// The mean interval in force ([`crate::Rate`]).
    pub const RATE: &str = "RATE";
    /// The duty cycle's gate.
    pub const GATE: &str = "GATE";
    /// USDT argument specifications by probe cookie.
    pub const USDT_SPECS: &str = "USDT_SPECS";
    /// The reference program's call count (benchmarks).
    pub const BARE_CALLS: &str = "BARE_CALLS";
    /// How to walk each Python process's frames, by pid.
    pub const PY_PROCESSES: &str = "PY_PROCESSES";
    /// One Python-frames record's scratch space per CPU.
    pub const PY_SCRATCH: &str = "PY_SCRATCH";
    /// One interpreter frame's words per CPU.
    pub const PY_FRAME_SCRATCH: &str = "PY_FRAME_SCRATCH";
    /// Where each Go process keeps its runtime's statistics, read at its exit.
    pub const GO_STATS: &str = "GO_STATS";
    /// Every map above.
    pub const ALL: &[&str] = &[
        SAMPLES,
        THREADS,
        COUNTERS,
        HOST_COUNTERS,
        EXCLUDED,
        FOLLOWED,
        FRONT_END,
        FUNCTION_SIZES,
        LIVE,
        LOST,
        LOSSES,
        SCRATCH,
        RATE,
        GATE,
        USDT_SPECS,
        BARE_CALLS,
        PY_PROCESSES,
        PY_SCRATCH,
        PY_FRAME_SCRATCH,
        GO_STATS,
    ];
}

/// Program names.
pub mod programs {
    /// `malloc` entry.
    pub const MALLOC: &str = "malloc_enter";
    /// `calloc` entry.
    pub const CALLOC: &str = "calloc_enter";
    /// `realloc` entry.
    pub const REALLOC: &str = "realloc_enter";
    /// `posix_memalign` entry.
    pub const POSIX_MEMALIGN: &str = "posix_memalign_enter";
    /// `aligned_alloc` entry.
    pub const ALIGNED_ALLOC: &str = "aligned_alloc_enter";
    /// `memalign` entry.
    pub const MEMALIGN: &str = "memalign_enter";
    /// `valloc` entry.
    pub const VALLOC: &str = "valloc_enter";
    /// `pvalloc` entry.
    pub const PVALLOC: &str = "pvalloc_enter";
    /// `operator new` entry.
    pub const NEW: &str = "new_enter";
    /// Entry and return in one uprobe session (kernels with sessions).
    pub const SESSION: &str = "alloc_session";
    /// Allocation return (uretprobe).
    pub const RETURN: &str = "alloc_return";
    /// `free` entry.
    pub const FREE: &str = "free_enter";
    /// The in-process front end's USDT probes.
    pub const USDT: &str = "usdt";
    /// Other programs' samplers' probes (`otel_memory`, `ddheap`, a Go runtime's).
    pub const PRODUCER: &str = "producer";
    /// `task_newtask` tracepoint (kernels without BTF for the raw one).
    pub const NEW_TASK: &str = "task_newtask";
    /// `task_newtask` raw tracepoint.
    pub const NEW_TASK_RAW: &str = "task_newtask_raw";
    /// `sched_process_exec` raw tracepoint.
    pub const EXEC: &str = "process_exec";
    /// `sched_process_exit` raw tracepoint.
    pub const EXIT: &str = "process_exit";
    /// `sched_prepare_exec` raw tracepoint (Linux 6.10 and later).
    pub const PREPARE_EXEC: &str = "process_prepare_exec";
    /// The benchmark's reference: counts calls, nothing else.
    pub const BARE: &str = "bare_count_enter";
    /// Every program above.
    pub const ALL: &[&str] = &[
        MALLOC,
        CALLOC,
        REALLOC,
        POSIX_MEMALIGN,
        ALIGNED_ALLOC,
        MEMALIGN,
        VALLOC,
        PVALLOC,
        NEW,
        SESSION,
        RETURN,
        FREE,
        USDT,
        PRODUCER,
        NEW_TASK,
        NEW_TASK_RAW,
        EXEC,
        EXIT,
        PREPARE_EXEC,
        BARE,
    ];
}

/// Configuration globals, set once at load.
pub mod globals {
    /// Mean sampling interval at start.
    pub const INTERVAL: &str = "INTERVAL";
    /// Its countdown scale (Q32).
    pub const SCALE_Q32: &str = "SCALE_Q32";
    /// Whether frees are tracked.
    pub const TRACK_FREES: &str = "TRACK_FREES";
    /// Whether the programs log.
    pub const LOG_ENABLED: &str = "LOG_ENABLED";
    /// Whether execs are reported.
    pub const WATCH_EXECS: &str = "WATCH_EXECS";
    /// Host-wide counters by pid.
    pub const HOST_MODE: &str = "HOST_MODE";
    /// Only the followed set counts.
    pub const FOLLOWED_ONLY: &str = "FOLLOWED_ONLY";
    /// The duty cycle's gate is read.
    pub const DUTY_CYCLED: &str = "DUTY_CYCLED";
    /// Bytes of stack copied per sample (`--unwind dwarf`).
    pub const STACK_BYTES: &str = "STACK_BYTES";
    /// Offset of `pid` in `task_struct` (from the kernel's BTF).
    pub const TASK_PID_OFFSET: &str = "TASK_PID_OFFSET";
    /// Whether sampled calls read CPython frames.
    pub const PYTHON_FRAMES: &str = "PYTHON_FRAMES";
    /// Every global above.
    pub const ALL: &[&str] = &[
        INTERVAL,
        SCALE_Q32,
        TRACK_FREES,
        LOG_ENABLED,
        WATCH_EXECS,
        HOST_MODE,
        FOLLOWED_ONLY,
        DUTY_CYCLED,
        STACK_BYTES,
        TASK_PID_OFFSET,
        PYTHON_FRAMES,
    ];
}
