//! What is known of each target apart from its samples: its name, executable, cgroup and
//! allocators as probed, and its resident set size and CPU time while it lived. Read from
//! /proc ([`crate::sys::process`]) and the process's CPU clock ([`crate::sys::clock`]) when the
//! recording starts tracking it and every refresh, and kept after it exits: a short-lived
//! process is described by what was read while it surely lived.

use std::collections::BTreeMap;

use super::tally::ProcessTally;
use crate::duty::sums::DutyPair;
use crate::probe::allocator::Allocator;
use crate::probe::go::memstats::{self, Totals};
use crate::schema::ExactCounts;
use crate::sys::maps::FileId;

/// The targets' descriptions, by pid.
#[derive(Debug, Default)]
pub struct ProcessBook {
    commands: BTreeMap<u32, String>,
    /// Processes whose command is their parent's (taken at their fork, not read since).
    inherited: std::collections::BTreeSet<u32>,
    executables: BTreeMap<u32, String>,
    cgroups: BTreeMap<u32, String>,
    /// Its allocator files, each as first described to users.
    allocators: BTreeMap<u32, Vec<(FileId, String)>>,
    /// What of it was resident (kept after the process exits).
    resident: BTreeMap<u32, ResidentSeen>,
    /// Its CPU time (ns) when first and last read.
    cpu: BTreeMap<u32, (u64, u64)>,
    /// Why the in-process sampler was not loaded into it (`-p`: probed with uprobes).
    not_loaded: BTreeMap<u32, String>,
    /// What its counts leave out, beyond what its allocators say.
    incomplete: BTreeMap<u32, Vec<String>>,
    /// A Go process's `runtime.MemProfileRate`: where it is, and its value when last read.
    go_rates: BTreeMap<u32, (u64, Option<u64>)>,
    /// A Go process's runtime totals, read from its memory ([`GoTotals`]).
    go_totals: BTreeMap<u32, GoTotals>,
    /// Processes found gone by a refresh: not looked for again (a build's thousands of
    /// exited processes cost every refresh two failed opens each).
    ended: std::collections::BTreeSet<u32>,
}

/// The mark of a Go process whose runtime's heap profiling was off (`MemProfileRate` 0)
/// when last looked at, among its `incomplete` notes: the profile's build says what it
/// means, knowing the samples (`profile::build`).
pub(super) const GO_RATE_ZERO: &str = "go: MemProfileRate 0";

/// A Go process's own exact totals (`runtime.memstats`, [`memstats`]): the first
/// reading of its program, where its recorded time starts, and the latest. A process that
/// exec'd a Go program again (a re-exec of itself, an upgrade in place) is read again in
/// its new program, from zero (its runtime started at the exec), each program's added up.
#[derive(Debug)]
struct GoTotals {
    layout: memstats::Layout,
    first: Totals,
    last: Totals,
    /// When this program's totals began to be kept (monotonic ns): an exec told with an
    /// earlier time was of an earlier program.
    since_ns: u64,
    /// What the programs it exec'd away from allocated while recorded.
    earlier: Totals,
    /// Programs before this one read at their exec (by the kernel, before their memory
    /// went), and read last while they ran (their last moments not counted).
    execs_read: u32,
    execs_unread: u32,
    /// The latest is what its exit left (read by the kernel as its last thread exited).
    at_exit: bool,
    /// It is gone: the latest reading is its last while it ran.
    gone: bool,
    /// It exec'd another program: its totals are in `earlier`, and the new program's are
    /// read once its files are found ([`ProcessBook::add_allocators`]).
    replaced: bool,
}

impl GoTotals {
    /// A program's totals, first read `now` (counted from `first`) at `since_ns`.
    fn new(layout: memstats::Layout, first: Totals, now: Totals, since_ns: u64) -> GoTotals {
        GoTotals {
            layout,
            first,
            last: now,
            since_ns,
            earlier: Totals::default(),
            execs_read: 0,
            execs_unread: 0,
            at_exit: false,
            gone: false,
            replaced: false,
        }
    }

    /// Reads `pid`'s totals now (`None`: gone, or not readable).
    fn read(layout: &memstats::Layout, pid: u32) -> Option<Totals> {
        let mut ring = vec![0u8; layout.reading_len()];
        crate::sys::memory::read_at(pid, layout.address, &mut ring).ok()?;
        layout.totals(&ring)
    }

    /// The process exec'd at `at_ns`, its program's totals then `ended` (`None`: not read,
    /// the last reading stands): they join the earlier programs'. An exec before this
    /// program's totals were kept, or told twice, changes nothing.
    fn exec(&mut self, at_ns: u64, ended: Option<Totals>) {
        if self.replaced || self.at_exit || at_ns < self.since_ns {
            return;
        }
        match ended {
            Some(ended) => {
                self.last = ended;
                self.execs_read += 1;
            }
            None => self.execs_unread += 1,
        }
        self.earlier = self.earlier.plus(self.last.since(self.first));
        self.first = Totals::default();
        self.last = Totals::default();
        self.replaced = true;
    }

    /// The new program's runtime, at `layout`, read `now` at `since_ns`: counted from zero,
    /// its runtime started at the exec.
    fn next_program(&mut self, layout: memstats::Layout, now: Totals, since_ns: u64) {
        self.layout = layout;
        self.last = now;
        self.since_ns = since_ns;
        self.gone = false;
        self.replaced = false;
    }

    /// The totals over the recording, and how they were read.
    fn recorded(&self) -> (ExactCounts, String) {
        let all = self.earlier.plus(if self.replaced {
            Totals::default()
        } else {
            self.last.since(self.first)
        });
        let when = if self.at_exit {
            "at its exit"
        } else if self.gone {
            "last while it ran: its last moments are not counted"
        } else if self.replaced {
            "as it exec'd a program not read"
        } else {
            "at the end"
        };
        let exact = ExactCounts {
            calls: all.objects,
            bytes: all.bytes,
        };
        let count = self.execs_read + self.execs_unread + u32::from(!self.replaced);
        let programs = match (count, self.execs_unread) {
            (0 | 1, _) => String::new(),
            (n, 0) => format!("; {n} Go programs it ran one after another, added up"),
            (n, unread) => format!(
                "; {n} Go programs it ran one after another, added up ({unread} read last \
                 while it ran before its exec: its last moments are not counted)"
            ),
        };
        (
            exact,
            format!("{}, read {when}{programs}", memstats::SOURCE),
        )
    }
}

/// What a new process of a tracked one was found to be when its fork was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forked {
    /// Still its parent's copy (no exec since its fork).
    Copy,
    /// Past an exec already (its fork told late): its exec event follows.
    Execd,
    /// Anything else (its parent untracked, or itself tracked already).
    Other,
}

/// What a tally adds to a process's description: sampled blocks whose frees could not be
/// tracked, samples lost without a stack, and the duty cycle's sums.
#[derive(Debug, Default)]
pub struct ProcessSamples {
    /// Sampled blocks whose frees could not be tracked.
    pub untracked: u64,
    /// Samples lost without a stack.
    pub lost: u64,
    /// Hits of another sampler's probes (a Go runtime's): its samples and their frees.
    pub runtime_hits: u64,
    /// Duty cycling: its bytes and calls over time-sampled strata.
    pub duty: Option<DutyPair>,
}

/// What of a process was seen resident (every 250 ms while it runs): the last reading, and
/// its anonymous memory when first read (its program's start, or the recording's) and at
/// most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ResidentSeen {
    rss: u64,
    anon_first: u64,
    anon_peak: u64,
}

impl ResidentSeen {
    /// Reads what of `pid` is resident into `seen` (`fresh`: counted from now, its program
    /// new); whether it is alive.
    fn note(seen: &mut BTreeMap<u32, ResidentSeen>, pid: u32, fresh: bool) -> bool {
        let Some(now) = crate::sys::process::resident_of(pid) else {
            return false;
        };
        let first = ResidentSeen {
            rss: now.rss,
            anon_first: now.anon,
            anon_peak: now.anon,
        };
        let seen = seen.entry(pid).or_insert(first);
        if fresh {
            *seen = first;
        }
        seen.rss = now.rss;
        seen.anon_peak = seen.anon_peak.max(now.anon);
        true
    }
}

impl ProcessBook {
    /// Forgets `pid` (gone, its last period sent: the agent).
    pub fn forget(&mut self, pid: u32) {
        self.commands.remove(&pid);
        self.inherited.remove(&pid);
        self.ended.remove(&pid);
        self.executables.remove(&pid);
        self.cgroups.remove(&pid);
        self.allocators.remove(&pid);
        self.resident.remove(&pid);
        self.go_rates.remove(&pid);
        self.go_totals.remove(&pid);
        self.cpu.remove(&pid);
        self.not_loaded.remove(&pid);
        self.incomplete.remove(&pid);
    }

    /// What `pid`'s counts leave out (said with its numbers, each reason once).
    pub fn incomplete(&mut self, pid: u32, why: String) {
        let reasons = self.incomplete.entry(pid).or_default();
        if !reasons.contains(&why) {
            reasons.push(why);
        }
    }

    /// `why` no longer holds for `pid` (said by [`Self::incomplete`] before).
    pub fn no_longer_incomplete(&mut self, pid: u32, why: &str) {
        if let Some(reasons) = self.incomplete.get_mut(&pid) {
            reasons.retain(|r| r != why);
        }
    }

    /// The in-process sampler could not be loaded into `pid`, for reason `why`.
    pub fn not_loaded(&mut self, pid: u32, why: String) {
        self.not_loaded.insert(pid, why);
    }

    /// Starts tracking `pid` (or again, after an exec): its command name, executable,
    /// cgroup, RSS and CPU time while it surely lives.
    pub fn track(&mut self, pid: u32) {
        let command = crate::sys::process::comm_of(pid);
        self.track_named(pid, command);
    }

    /// [`Self::track`], its name `command` as just read (or as the kernel told it at its
    /// exec). Its cgroup is kept if it is known (an exec does not move a process): read
    /// once per process, not at its fork and again at its exec.
    pub fn track_named(&mut self, pid: u32, command: Option<String>) {
        let reused = self.ended.remove(&pid);
        let command = command.unwrap_or_default();
        if !command.is_empty() {
            self.inherited.remove(&pid);
        }
        self.commands.insert(pid, command);
        if reused || !self.cgroups.contains_key(&pid) {
            if let Some(cgroup) = crate::sys::process::cgroup_of(pid) {
                self.cgroups.insert(pid, cgroup);
            }
        }
        if let Some(exe) = crate::sys::process::executable_of(pid) {
            self.executables.insert(pid, exe.display().to_string());
        }
        // A new program (or a new process): its anonymous memory is counted from now.
        ResidentSeen::note(&mut self.resident, pid, true);
        self.note_cpu(pid);
    }

    /// Reads `pid`'s CPU time: the first reading is where its recorded time starts (a new
    /// process's is ~0), the latest where it ends.
    fn note_cpu(&mut self, pid: u32) {
        if let Some(ns) = crate::sys::clock::process_cpu_ns(pid) {
            self.cpu
                .entry(pid)
                .and_modify(|(_, last)| *last = ns)
                .or_insert((ns, ns));
        }
    }

    /// Starts tracking `pid`, a new process of `parent` (forked, not exec'd yet): what it
    /// cannot tell about itself any more (it may already be gone) is its parent's. A fork
    /// of a tracked parent, still running its parent's program, is a copy of it (its
    /// executable and cgroup), only its name read: most children exec at once, and are
    /// read then ([`Self::track`]); one that does not is read at the next refresh (its CPU
    /// time counted from then). Returns what it was found to be.
    pub fn track_fork(&mut self, pid: u32, parent: u32) -> Forked {
        let comm = crate::sys::process::comm_of(pid);
        // Past an exec already (its fork told late): not a copy of its parent.
        let exec_since = comm
            .as_deref()
            .is_some_and(|c| self.command(parent) != Some(c));
        let new_child = self.tracks(parent) && !self.tracks(pid);
        let copy = new_child && !exec_since;
        if new_child {
            // Only its name read now. One past an exec is read at its exec event, which
            // follows (its executable, RSS, CPU time; reading them here too cost
            // allocscope's time per process of a shell loop, most of whose forks are told
            // after their exec: docs/performance.md, "Figures quoted from the code"); one
            // renamed without an exec, at the next refresh.
            self.ended.remove(&pid);
            if exec_since {
                self.cgroups.remove(&pid);
            }
            if let Some(comm) = comm.filter(|c| !c.is_empty()) {
                self.commands.insert(pid, comm);
            }
        } else {
            // A new process: a cgroup known for its pid was an older process's.
            self.cgroups.remove(&pid);
            self.track_named(pid, comm);
        }
        if self.commands.get(&pid).is_none_or(String::is_empty) {
            self.inherited.insert(pid);
        }
        for names in [&mut self.commands, &mut self.executables] {
            if names.get(&pid).is_none_or(String::is_empty) {
                if let Some(name) = names.get(&parent).cloned() {
                    names.insert(pid, name);
                }
            }
        }
        if !self.cgroups.contains_key(&pid) {
            if let Some(cgroup) = self.cgroups.get(&parent).cloned() {
                self.cgroups.insert(pid, cgroup);
            }
        }
        if copy {
            Forked::Copy
        } else if new_child {
            Forked::Execd
        } else {
            Forked::Other
        }
    }

    /// Names `pid` `command` (as the kernel reported it at an exec or fork) if it could not
    /// be read from /proc: it was gone already.
    pub fn name_if_unknown(&mut self, pid: u32, command: &str) {
        let name = self.commands.entry(pid).or_default();
        if name.is_empty() {
            command.clone_into(name);
        }
    }

    /// `pid`'s name as its in-process library wrote it after its latest exec: taken where
    /// allocscope has none of its own reading (unknown, or its parent's from its fork).
    pub fn name_from_region(&mut self, pid: u32, command: &str) {
        let name = self.commands.entry(pid).or_default();
        if name.is_empty() || self.inherited.remove(&pid) {
            command.clone_into(name);
        }
    }

    /// `pid`'s command name, if it is tracked and has one.
    pub fn command(&self, pid: u32) -> Option<&str> {
        self.commands
            .get(&pid)
            .map(String::as_str)
            .filter(|c| !c.is_empty())
    }

    /// Names `pid` by the program it exec'd (`command`, as the kernel named it then),
    /// whatever it was named before.
    pub fn name_after_exec(&mut self, pid: u32, command: &str) {
        self.inherited.remove(&pid);
        self.commands.insert(pid, command.to_owned());
    }

    /// Whether `pid` ran a Go program whose totals were read.
    pub fn ran_go(&self, pid: u32) -> bool {
        self.go_totals.contains_key(&pid)
    }

    /// `pid` exec'd a new program at `at_ns`: a Go runtime's variable, if any, is found
    /// again with its files; the old program's totals stand as read at its exec, or last
    /// read if the kernel could not ([`Self::go_stats_at_exec`]).
    pub fn exec_seen(&mut self, pid: u32, at_ns: u64) {
        self.go_rates.remove(&pid);
        if let Some(totals) = self.go_totals.get_mut(&pid) {
            totals.exec(at_ns, None);
        }
    }

    /// Whether `pid` is tracked already.
    pub fn tracks(&self, pid: u32) -> bool {
        self.commands.contains_key(&pid)
    }

    /// Every process tracked.
    pub fn pids(&self) -> Vec<u32> {
        self.commands.keys().copied().collect()
    }

    /// Every process anything is kept for, tracked or not (a process seen host-wide and
    /// never sampled has its allocators kept): what [`Self::forget`] may have to drop.
    pub fn known(&self) -> std::collections::BTreeSet<u32> {
        let mut known = self.ended.clone();
        known.extend(self.commands.keys());
        known.extend(self.executables.keys());
        known.extend(self.cgroups.keys());
        known.extend(self.allocators.keys());
        known.extend(self.resident.keys());
        known.extend(self.cpu.keys());
        known.extend(self.not_loaded.keys());
        known.extend(self.incomplete.keys());
        known.extend(self.go_rates.keys());
        known.extend(self.go_totals.keys());
        known
    }

    /// Re-reads the CPU time and RSS of the processes still alive, and the name of those
    /// that exec'd since.
    pub fn refresh(&mut self) {
        for (&pid, command) in &mut self.commands {
            if self.ended.contains(&pid) {
                continue;
            }
            let Some(ns) = crate::sys::clock::process_cpu_ns(pid) else {
                self.ended.insert(pid);
                if let Some(totals) = self.go_totals.get_mut(&pid) {
                    totals.gone = true;
                }
                continue;
            };
            // A fork's first reading (nothing was read at its fork) is where its time starts.
            self.cpu
                .entry(pid)
                .and_modify(|(_, last)| *last = ns)
                .or_insert((ns, ns));
            if let Some((at, rate)) = self.go_rates.get_mut(&pid) {
                *rate = crate::sys::memory::word_of(pid, *at).or(*rate);
            }
            if ResidentSeen::note(&mut self.resident, pid, false) {
                if let Some(now) = crate::sys::process::comm_of(pid) {
                    *command = now;
                    self.inherited.remove(&pid);
                }
            }
        }
    }

    /// Reads the Go runtime totals of the processes still alive (before the counters are
    /// read: both cover the same time).
    pub fn read_go_totals(&mut self) {
        for (&pid, totals) in &mut self.go_totals {
            if totals.at_exit || totals.gone || totals.replaced {
                continue;
            }
            match GoTotals::read(&totals.layout, pid) {
                Some(now) => totals.last = now,
                None => totals.gone = true,
            }
        }
    }

    /// `pid`'s Go runtime statistics as its exec at `at_ns` left them, its old program's
    /// memory still there (`bytes` empty: the kernel could not read them; the last reading
    /// while it ran stands).
    pub fn go_stats_at_exec(&mut self, pid: u32, bytes: &[u8], at_ns: u64) {
        if let Some(totals) = self.go_totals.get_mut(&pid) {
            let ended = totals.layout.totals(bytes);
            totals.exec(at_ns, ended);
        }
    }

    /// `pid`'s Go runtime statistics and rate as its exit left them (`bytes` empty: the
    /// kernel could not read them; the last reading while it ran stands).
    pub fn go_stats_at_exit(&mut self, pid: u32, bytes: &[u8], rate: Option<u64>) {
        if let (Some((_, last)), Some(rate)) = (self.go_rates.get_mut(&pid), rate) {
            *last = Some(rate);
        }
        let Some(totals) = self.go_totals.get_mut(&pid).filter(|t| !t.replaced) else {
            return;
        };
        match totals.layout.totals(bytes) {
            Some(at_exit) => {
                totals.last = at_exit;
                totals.at_exit = true;
            }
            None => totals.gone = true,
        }
    }

    /// Whether `pid` was seen carrying an in-process front end.
    pub fn carries_front_end(&self, pid: u32) -> bool {
        self.allocators.get(&pid).is_some_and(|all| {
            all.iter()
                .any(|(_, d)| crate::probe::allocator::describes_in_process(d))
        })
    }

    /// Adds the allocators probed in `pid` (each file described once, as JSON reports
    /// them, by the first path it was seen at: /lib and /usr/lib are one file) to those
    /// probed in it before: a process attached at exec, before its libraries are mapped,
    /// gains its C library a moment later.
    /// A Go runtime whose exact totals it can read is read now: where its recorded time
    /// starts, unless it was recorded `from_start` (from its exec, probes in place: its
    /// runtime counted from zero then, which it may be well past by the time it is looked
    /// at). Returns where the totals and its rate are, for the kernel to read them at its
    /// exit.
    pub fn add_allocators(
        &mut self,
        pid: u32,
        allocators: &[Allocator],
        from_start: bool,
    ) -> Option<sampler_common::GoStatsAt> {
        let described = self.allocators.entry(pid).or_default();
        let mut watch = None;
        for allocator in allocators {
            let producer = allocator.file.producer.as_ref();
            let bias = producer.and_then(|p| p.bias_in(pid, &allocator.file_id));
            let places = allocator.file.go.as_ref();
            let rate_at = places.map(|p| p.rate_at);
            if let (Some(at), Some(bias)) = (rate_at, bias) {
                let at = at.wrapping_add(bias);
                let now = crate::sys::memory::word_of(pid, at);
                self.go_rates.insert(pid, (at, now));
            }
            let layout = places.map(|p| &p.memstats);
            // Read already, unless it exec'd a new program since.
            let replaced = self.go_totals.get(&pid).map(|t| t.replaced);
            if let (Some(Ok(layout)), Some(bias), None | Some(true)) = (layout, bias, replaced) {
                let layout = memstats::Layout {
                    address: layout.address.wrapping_add(bias),
                    ..layout.clone()
                };
                // A new program's runtime not set up yet (just past its exec) has
                // allocated nothing.
                let now = GoTotals::read(&layout, pid).or(replaced.is_some().then(Totals::default));
                if let Some(now) = now {
                    watch = Some(sampler_common::GoStatsAt {
                        address: layout.address,
                        rate_address: self.go_rates.get(&pid).map_or(0, |r| r.0),
                        len: layout.reading_len() as u32,
                        pad: 0,
                    });
                    let at_ns = crate::collect::monotonic_ns();
                    match self.go_totals.get_mut(&pid) {
                        Some(totals) => totals.next_program(layout, now, at_ns),
                        None => {
                            // Its runtime counted from zero at its exec, where its
                            // recording began.
                            let first = if from_start { Totals::default() } else { now };
                            let totals = GoTotals::new(layout, first, now, at_ns);
                            self.go_totals.insert(pid, totals);
                        }
                    }
                }
            }
            if !described.iter().any(|(file, _)| *file == allocator.file_id) {
                described.push((allocator.file_id.clone(), allocator.describe()));
            }
        }
        watch
    }

    /// `pid`'s Go runtime in `file` is read, not probed: said with its description.
    pub fn read_not_probed(&mut self, pid: u32, file: &crate::sys::maps::FileId) {
        let described = self.allocators.entry(pid).or_default();
        for (_, name) in described.iter_mut().filter(|(f, _)| f == file) {
            if !name.ends_with(crate::probe::go::READ) {
                name.push_str("; ");
                name.push_str(crate::probe::go::READ);
            }
        }
    }

    /// Every process tracked, described, with what `samples` says of its samples.
    pub fn tally(&self, samples: impl Fn(u32) -> ProcessSamples) -> Vec<ProcessTally> {
        self.commands
            .iter()
            .map(|(&pid, command)| {
                let ProcessSamples {
                    untracked,
                    lost,
                    runtime_hits,
                    duty,
                } = samples(pid);
                ProcessTally {
                    pid,
                    command: command.clone(),
                    executable: self.executables.get(&pid).cloned().unwrap_or_default(),
                    rss_bytes: self.resident.get(&pid).map(|r| r.rss),
                    anon_first_and_peak: self
                        .resident
                        .get(&pid)
                        .map(|r| (r.anon_first, r.anon_peak)),
                    cpu_seconds: self
                        .cpu
                        .get(&pid)
                        .map(|&(first, last)| last.saturating_sub(first) as f64 / 1e9),
                    untracked_samples: untracked,
                    lost_samples: lost,
                    runtime_hits,
                    cgroup: self.cgroups.get(&pid).cloned(),
                    allocators: self
                        .allocators
                        .get(&pid)
                        .map(|files| files.iter().map(|(_, name)| name.clone()).collect())
                        .unwrap_or_default(),
                    duty,
                    go_totals: self.go_totals.get(&pid).map(GoTotals::recorded),
                    not_loaded: self.not_loaded.get(&pid).cloned(),
                    incomplete: self
                        .incomplete
                        .get(&pid)
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .chain(
                            (self.go_rates.get(&pid).and_then(|r| r.1) == Some(0))
                                .then(|| GO_RATE_ZERO.to_owned()),
                        )
                        .collect(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(address: u64) -> memstats::Layout {
        memstats::Layout {
            address,
            delta_size: 64,
            tiny_count: 0,
            large_bytes: 8,
            large_count: 16,
            small_counts: 24,
            class_sizes: vec![0, 8],
        }
    }

    fn totals(bytes: u64, objects: u64) -> Totals {
        Totals { bytes, objects }
    }

    #[test]
    fn a_go_program_that_execs_again_adds_up_its_programs() {
        // Attached while running (first reading 100 in), then two execs of itself: the
        // first read by the kernel at the exec, the second not (last read: 650).
        let mut go = GoTotals::new(layout(0x1000), totals(100, 10), totals(100, 10), 1_000);
        go.last = totals(300, 30);
        // An exec before its totals were kept (the command's own) is not its.
        go.exec(500, None);
        assert!(!go.replaced);
        go.exec(2_000, Some(totals(700, 70)));
        // Told again by the exec event: once is enough.
        go.exec(2_001, None);
        assert_eq!((go.execs_read, go.execs_unread), (1, 0));
        assert_eq!(go.recorded().0.bytes, 600);
        go.next_program(layout(0x2000), totals(5, 1), 3_000);
        assert_eq!(go.layout.address, 0x2000);
        go.last = totals(650, 60);
        go.exec(4_000, None);
        go.next_program(layout(0x3000), totals(0, 0), 5_000);
        go.last = totals(720, 72);
        go.at_exit = true;
        let (exact, source) = go.recorded();
        assert_eq!((exact.bytes, exact.calls), (600 + 650 + 720, 60 + 60 + 72));
        assert!(source.contains("read at its exit"), "{source}");
        assert!(
            source.contains("3 Go programs it ran one after another, added up (1 read last"),
            "{source}"
        );
        // Never re-exec'd: as before.
        let once = GoTotals::new(layout(0x1000), Totals::default(), totals(9, 3), 0);
        assert_eq!(once.recorded().1, "runtime.memstats, read at the end");
        // Exec'd a program that is not Go: the earlier programs' totals stand.
        let mut left = GoTotals::new(layout(0x1000), Totals::default(), totals(9, 3), 0);
        left.exec(10, Some(totals(12, 4)));
        let (exact, source) = left.recorded();
        assert_eq!(exact.bytes, 12);
        assert_eq!(
            source,
            "runtime.memstats, read as it exec'd a program not read"
        );
    }

    #[test]
    fn a_process_is_described_while_alive_and_after() {
        let mut book = ProcessBook::default();
        let me = std::process::id();
        assert!(!book.tracks(me));
        book.track(me);
        assert!(book.tracks(me));
        // A fork that is gone before it is read takes its parent's names.
        book.track_fork(u32::MAX - 1, me);
        book.name_if_unknown(u32::MAX - 2, "gone");
        book.refresh();
        let tally = book.tally(|pid| ProcessSamples {
            untracked: u64::from(pid == me),
            ..ProcessSamples::default()
        });
        let mine = tally.iter().find(|p| p.pid == me).unwrap();
        assert!(!mine.command.is_empty() && !mine.executable.is_empty());
        assert!(mine.rss_bytes.is_some_and(|b| b > 0) && mine.cpu_seconds.is_some());
        assert_eq!(mine.untracked_samples, 1);
        let fork = tally.iter().find(|p| p.pid == u32::MAX - 1).unwrap();
        assert_eq!(
            (&fork.command, &fork.executable),
            (&mine.command, &mine.executable)
        );
        assert_eq!(fork.cpu_seconds, None, "never read: not guessed");
        let named = tally.iter().find(|p| p.pid == u32::MAX - 2).unwrap();
        assert_eq!(named.command, "gone");
    }

    #[test]
    fn a_reason_is_said_once_and_goes_when_it_no_longer_holds() {
        let mut book = ProcessBook::default();
        let me = std::process::id();
        book.track(me);
        book.incomplete(me, "unread".into());
        book.incomplete(me, "unread".into());
        book.incomplete(me, "other".into());
        let reasons = |book: &ProcessBook| {
            let tally = book.tally(|_| ProcessSamples::default());
            tally
                .iter()
                .find(|p| p.pid == me)
                .unwrap()
                .incomplete
                .clone()
        };
        assert_eq!(reasons(&book), ["unread", "other"]);
        book.no_longer_incomplete(me, "unread");
        assert_eq!(reasons(&book), ["other"]);
    }
}
