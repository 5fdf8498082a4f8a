//! What the kernel and the intake could not keep (the profile's `lost`). How it is read is
//! allocscope-target's `collect`.

/// Loss counters summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Losses {
    /// Samples that found the ring buffer full: their stacks are lost, their sizes are
    /// counted under each process's "samples lost" pseudo-stack (all but
    /// `lost_unrecorded` of them).
    pub ringbuf_full: u64,
    /// Samples sent without a user stack.
    pub stack_missing: u64,
    /// Calls whose target had no counter slot (should stay 0).
    pub counters_full: u64,
    /// Calls neither counted nor sampled (thread map refused an entry).
    pub thread_state_full: u64,
    /// Sampled blocks whose frees could not be tracked (live map full).
    #[serde(default)]
    pub live_map_full: u64,
    /// Frees of tracked blocks not delivered (ring buffer full): those blocks still count
    /// as live, so live numbers may be high.
    #[serde(default)]
    pub free_event_lost: u64,
    /// Fork and exec events of followed processes not delivered (ring buffer full).
    #[serde(default)]
    pub process_event_lost: u64,
    /// Lost samples the kernel could not even count by size (its lost-sample map was full):
    /// the totals leave them out.
    #[serde(default)]
    pub lost_unrecorded: u64,
    /// New processes of followed ones (or exec'd ones `--comm` was to decide on) the
    /// kernel could not add to its followed set (full): they were not counted.
    #[serde(default)]
    pub followed_full: u64,
    /// Processes carrying an in-process front end the kernel could not note as such
    /// (its table full): file-wide probes may have counted their calls twice.
    #[serde(default)]
    pub front_end_full: u64,
    /// Samples whose stack was cut to its leaf frame (more distinct stacks than
    /// `--max-stacks`): counted in full, under a shorter stack. Counted in user space.
    #[serde(default)]
    pub stacks_cut_to_leaf: u64,
}

impl Losses {
    /// Total of all counters.
    pub fn total(&self) -> u64 {
        self.ringbuf_full
            + self.stack_missing
            + self.counters_full
            + self.thread_state_full
            + self.live_map_full
            + self.free_event_lost
            + self.process_event_lost
            + self.lost_unrecorded
            + self.followed_full
            + self.front_end_full
            + self.stacks_cut_to_leaf
    }
}
