//! A command that runs while its probes load: `record -- CMD` counted in-process alone
//! releases the command at once and has its library keep early records (see
//! `sampler-preload`'s `early_records`) until the probes are attached, instead of holding
//! the command before its exec for the load (docs/performance.md, "The in-process front
//! end"). Once attached, the records are read while their writers
//! wait, the tree's processes that started meanwhile are followed, the blocks still live
//! go into the kernel's live map (their frees come through the probes), and the records
//! become the recording's first events, before any the ring buffer brings.
//!
//! Only where nothing else needs the command to wait: its samples' stacks are copied
//! (`--unwind dwarf`: the library copies the stack as the kernel would), no duty cycle
//! (its first slot opens before the command runs). Where Python frames are read, the
//! library walks them for its early samples as the kernel would at the probe, and a
//! thread resolves them while the command runs (`python::early_frames`).

use log::{debug, warn};

use super::Recording;
use crate::{collect::early_decode, probe::attach::KernelConfig, spawn::PausedChild};

/// Whether a command counted in-process alone (`in_process_only`) may run before its
/// probes are attached, under `config`.
pub(super) fn may_run_early(config: &KernelConfig, in_process_only: bool) -> bool {
    in_process_only && config.stack_bytes != 0 && !config.duty_cycled
}

/// A command let run while its probes load.
pub(super) struct EarlyRun {
    /// Its pid.
    pub pid: u32,
    /// When it was let go (the samples' clock, and the recording's).
    pub released: (u64, std::time::Instant),
    /// When it exited, once it has.
    pub exited: ExitSeen,
    /// Resolving its early samples' Python frames while it runs (where they are read).
    pub python: Option<crate::python::early_frames::Watcher>,
    /// Its tree's process events, read until the probes are attached.
    pub events: Option<crate::sys::proc_events::Watch>,
}

/// What is left of an early run once its records are taken in, for after the first
/// look at the tree ([`Recording::end_early`]).
pub(super) struct EarlyEnd {
    exited: ExitSeen,
    events: Option<crate::sys::proc_events::Watch>,
}

/// When a command let go early exited, as a thread waiting on its pidfd saw it: a command
/// that exits while allocscope still attaches is noticed only after, and its recording's
/// duration (rates per second, a diff's) would count allocscope's wait as its run.
pub(super) type ExitSeen = std::sync::Arc<std::sync::OnceLock<std::time::Instant>>;

/// Listens for the process events of `root`'s tree while its probes load (see
/// [`crate::sys::proc_events`]); nothing, said with `-v`, where the kernel refuses.
fn watch_tree(root: u32) -> Option<crate::sys::proc_events::Watch> {
    crate::sys::proc_events::Watch::start(root)
        .map_err(|e| {
            debug!("process events not read while the probes load (a child that drops the library then is not named): {e}");
        })
        .ok()
}

/// What a process that exec'd a program without the library while the probes loaded
/// leaves out.
fn unseen_after(program: &str, before: &str) -> String {
    format!(
        "exec'd {program} without the in-process library (a cleared environment, its own \
         LD_PRELOAD, static or set-user-ID){before}: its allocations since that exec were not \
         seen"
    )
}

/// Passes over the command's tree at most (see [`Recording::follow_tree`]): each finds the
/// children of those the one before followed, forked before they were; 2 mostly.
const TREE_PASSES: usize = 8;

/// How long a command let run early is given to finish before its probes are loaded:
/// longer ones wait that much more for their probes, their early records covering it.
const LOAD_GRACE: std::time::Duration = std::time::Duration::from_millis(5);

/// Loads the probes (`load`) on a thread of its own while `run`'s command runs, unless its
/// whole tree exits first (every process's exit read from the kernel's process events): a
/// short command then waits for no verification and no attach (docs/performance.md, "The
/// in-process front end"), and its recording is made of its early records and its
/// processes' exact counts alone ([`Recording::probeless`]); `None` says so. Where the tree
/// is not watched, the load is waited for.
pub(super) fn load_unless_gone<L>(
    run: &EarlyRun,
    load: L,
) -> anyhow::Result<Option<(crate::probe::attach::Probes, bool)>>
where
    L: FnOnce() -> anyhow::Result<(crate::probe::attach::Probes, bool)> + Send + 'static,
{
    use std::sync::mpsc::RecvTimeoutError;
    let Some(events) = run.events.as_ref() else {
        return load().map(Some);
    };
    let gone = || events.gone() && run.exited.get().is_some();
    // A command that is over in a few milliseconds (`true`, `echo`) leaves no work to the
    // load at all: it would take a core from the recording's end.
    let grace = std::time::Instant::now() + LOAD_GRACE;
    while std::time::Instant::now() < grace {
        if gone() {
            debug!("the command's tree exited before the probes were loaded: nothing attached");
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_micros(250));
    }
    let (sender, loaded) = std::sync::mpsc::channel();
    // Left behind when the tree is gone first: what it loads is closed when its send finds
    // nobody, and a verification still running ends with allocscope.
    std::thread::Builder::new()
        .name("load-probes".into())
        .spawn(move || {
            delay_for_tests();
            let _ = sender.send(load());
        })
        .map_err(|e| anyhow::anyhow!("starting the thread that loads the probes: {e}"))?;
    loop {
        match loaded.recv_timeout(std::time::Duration::from_millis(1)) {
            Ok(result) => return result.map(Some),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                anyhow::bail!("the thread loading the probes stopped")
            }
        }
        if gone() {
            debug!("the command's tree exited while the probes loaded: nothing attached");
            return Ok(None);
        }
    }
}

/// For the tests of a command gone before its probes load (tests/tests/preload.rs): with
/// `ALLOCSCOPE_LOAD_DELAY_MS=N` the load starts N ms late, whatever else the machine is
/// running (the load takes a while, a busy CI's short command longer: docs/performance.md,
/// "Figures quoted from the code").
fn delay_for_tests() {
    let delay = std::env::var("ALLOCSCOPE_LOAD_DELAY_MS")
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok());
    if let Some(ms) = delay {
        std::thread::sleep(std::time::Duration::from_millis(ms.min(60_000)));
    }
}

/// Starts a thread that notes when `pid` (our child) exits; nothing if it cannot.
pub(super) fn watch_exit(pid: u32) -> ExitSeen {
    let seen = ExitSeen::default();
    let Ok(fd) = crate::exits::pidfd_open(pid) else {
        return seen;
    };
    let noted = seen.clone();
    let spawned = std::thread::Builder::new()
        .name("command-exit".into())
        .spawn(move || {
            use std::os::fd::AsRawFd as _;
            let mut poll = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one live descriptor, until it is readable (the exit).
            while unsafe { libc::poll(&mut poll, 1, -1) } < 0 {}
            let _ = noted.set(std::time::Instant::now());
        });
    if let Err(e) = spawned {
        debug!("the command's exit time is not watched: {e}");
    }
    seen
}

/// Lets `child` run now, its tree keeping early records in `family` (with the stack
/// `config` copies, and Python frames where it reads them).
pub(super) fn release_now(
    child: PausedChild,
    family: &crate::preload::FamilyTable,
    config: &KernelConfig,
    command: &str,
) -> anyhow::Result<EarlyRun> {
    let pid = child.pid;
    // Started first: it only reads the table, and is ready for the first record.
    let python = if config.python_frames {
        let watcher = family
            .early_records()
            .and_then(|records| Ok(crate::python::early_frames::Watcher::start(records)?));
        match watcher {
            Ok(watcher) => Some(watcher),
            Err(e) => {
                warn!("Python frames of the samples taken while attaching not resolved: {e:#}");
                None
            }
        }
    } else {
        None
    };
    family.keep_early(config.stack_bytes);
    let events = watch_tree(pid);
    if let Err(e) = child.release() {
        family.end_early();
        return Err(crate::settings::BadInput(format!("cannot run {command}: {e}")).into());
    }
    Ok(EarlyRun {
        pid,
        released: (crate::collect::monotonic_ns(), std::time::Instant::now()),
        exited: watch_exit(pid),
        python,
        events,
    })
}

impl Recording {
    /// The probes are attached: the command let run early is tracked from its release,
    /// and its early records are taken in. Returns what watches its exit and its tree.
    pub(super) fn take_early(
        &mut self,
        run: EarlyRun,
        track_frees: bool,
    ) -> anyhow::Result<EarlyEnd> {
        let (released_ns, released) = run.released;
        self.command.began = released;
        self.cost.throttle_since(released_ns);
        self.aggregation.track(run.pid);
        if let (Some(_), Some(family)) = (&run.python, self.in_process.family()) {
            // The tree's interpreters found (their files analysed already, for the early
            // records) before their first samples through the probes, which would otherwise
            // have no Python frames until the intake thread found them (a child running
            // Python lost 4 in 10 of a site's samples' frames so).
            let mut pids = family.members();
            pids.push(run.pid);
            pids.sort_unstable();
            pids.dedup();
            self.intake
                .reader()
                .examine_now(&pids, std::time::Duration::from_millis(100));
        }
        self.finish_early(track_frees, run.python)?;
        Ok(EarlyEnd {
            exited: run.exited,
            events: run.events,
        })
    }

    /// After the first look at the tree: names the processes that ran unseen meanwhile,
    /// and ends the recording at the command's exit if its tree is gone already.
    pub(super) fn end_early(&mut self, end: EarlyEnd) {
        if let Some(events) = end.events {
            self.note_unseen(events.finish());
        }
        self.note_early_end(&end.exited);
    }

    /// Names the tree's processes that exec'd while the probes loaded and exited before
    /// they were attached, where their program did not carry the library (they are not
    /// known by its name, and no allocator was probed for them): their allocations were
    /// not seen, and each says so. Before, they were missing without a word, or listed
    /// under their parent's name with its few calls. (One that exec'd after the kernel
    /// followed the tree, `--follow`'s case, and exited before its allocator could be
    /// probed is among them.)
    fn note_unseen(&mut self, tree: crate::sys::proc_events::Tree) {
        if tree.lost {
            warn!("process events were lost while the probes loaded: a child that dropped the in-process library then and exited may be missing without a name");
        }
        for (pid, exec_ns, program) in tree.gone_after_exec() {
            // Attached since (its allocator probed for it): counted from then, as said.
            if self
                .discovered
                .coverage(pid)
                .is_some_and(|c| !c.late.is_empty())
            {
                continue;
            }
            // The library sets up after each exec that carries it; with no region (no slot
            // claimed), a program it counted wrote its name.
            let counted = match self.library_set_up_ns(pid) {
                Some(set_up_ns) => set_up_ns >= exec_ns,
                None => self
                    .aggregation
                    .processes
                    .command(pid)
                    .is_some_and(|known| program.is_none_or(|p| same_comm(known, p))),
            };
            if counted {
                continue;
            }
            if !self.aggregation.processes.tracks(pid) {
                self.aggregation.processes.track(pid);
            }
            let program = match program {
                Some(program) => {
                    let processes = &mut self.aggregation.processes;
                    processes.name_after_exec(pid, program);
                    processes.exec_seen(pid, exec_ns);
                    program
                }
                None => {
                    self.aggregation.processes.name_if_unknown(pid, "?");
                    "a program (gone before it could be named)"
                }
            };
            debug!(
                "pid {pid}: exec'd {program} unseen while the probes loaded (exec at {exec_ns}, library set up at {:?})",
                self.library_set_up_ns(pid)
            );
            self.aggregation.processes.incomplete(
                pid,
                unseen_after(
                    program,
                    " while the probes loaded, and exited before they were attached",
                ),
            );
        }
    }

    /// A followed process whose exec was looked at only after it had exited (its maps
    /// unread: process events are read every few milliseconds, see `collect::POLL_MS`):
    /// where its new `program` did not set the library up after the exec (at `exec_ns`),
    /// nothing it allocated since was seen, and it says so.
    pub(super) fn note_unseen_exec(&mut self, pid: u32, program: &str, exec_ns: u64) {
        if self
            .library_set_up_ns(pid)
            .is_some_and(|set_up| set_up >= exec_ns)
        {
            return;
        }
        debug!("pid {pid}: exec'd {program} and exited before its allocators were read");
        self.aggregation.processes.incomplete(
            pid,
            unseen_after(
                program,
                ", and exited before allocscope could probe its allocator",
            ),
        );
    }

    /// When the library last set up in `pid` (its region's, mapped already or read from
    /// the family table now), if it claimed one.
    fn library_set_up_ns(&self, pid: u32) -> Option<u64> {
        self.accounting.counters.region_set_up_ns(pid).or_else(|| {
            let found = self.in_process.family()?.region_of(pid)?;
            found.ok().map(|region| region.set_up_ns())
        })
    }

    /// The probes are attached: the early records are taken in (see the module doc).
    /// `track_frees`: the recording tracks frees; `python`: the thread resolving the
    /// samples' Python frames.
    fn finish_early(
        &mut self,
        track_frees: bool,
        python: Option<crate::python::early_frames::Watcher>,
    ) -> anyhow::Result<()> {
        let Some(family) = self.in_process.family() else {
            return Ok(());
        };
        if !family.keeps_early() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let read = match family.hold_early() {
            Ok(read) => read,
            Err(e) => {
                family.end_early();
                return Err(e.context("reading the samples taken while attaching"));
            }
        };
        self.follow_tree();
        let mut records = read.records;
        if !self.targets.follow {
            // `--no-follow`: the command's own, not its children's (which carry the
            // library all the same).
            records.retain(|record| self.command.is(record.pid()));
        }
        let mut resolved = python.map(crate::python::early_frames::Watcher::finish);
        let mut taken = early_decode::events(records, track_frees, |index, record| {
            resolved.as_mut()?.take(index, record)
        });
        let python_missing = resolved.as_ref().map_or(0, |r| r.missing());
        if python_missing > 0 {
            warn!(
                "{python_missing} samples taken while attaching lost their Python frames \
                 (the library found no interpreter, or another than allocscope did)"
            );
        }
        self.track_live_blocks(&mut taken);
        if let Some(family) = self.in_process.family() {
            family.end_early();
        }
        if read.incomplete + taken.malformed > 0 {
            warn!(
                "{} samples taken while attaching were incomplete or malformed: left out",
                read.incomplete + taken.malformed
            );
        }
        debug!(
            "{} events taken while attaching ({} live, {} samples waited) read in {:?}",
            taken.events.len(),
            taken.live.len(),
            read.waited,
            started.elapsed()
        );
        self.intake.extend(taken.events);
        self.take_batch();
        Ok(())
    }

    /// Puts the blocks the early records leave live into the kernel's live map, so that
    /// their frees are seen; a block that finds no room is marked untracked (said).
    fn track_live_blocks(&mut self, taken: &mut early_decode::Early) {
        let mut untracked = Vec::new();
        if let Some(probes) = self.probes.as_mut() {
            for &(pid, address, at) in &taken.live {
                if !matches!(probes.track_live(pid, address, at), Ok(true)) {
                    untracked.push((pid, address));
                }
            }
        }
        if untracked.is_empty() {
            return;
        }
        for event in &mut taken.events {
            if let crate::collect::Event::Alloc(sample) = event {
                if untracked.contains(&(sample.pid, sample.address)) {
                    sample.tracked = false;
                }
            }
        }
        warn!(
            "{} blocks sampled while attaching could not be tracked (live map full): \
             their frees go unseen",
            untracked.len()
        );
    }

    /// The command's tree is gone already (every target exited while the probes were being
    /// attached): the recording ends at the command's exit (`exited`) for its duration.
    fn note_early_end(&mut self, exited: &ExitSeen) {
        let Some(&at) = exited.get() else {
            return;
        };
        let alive =
            |pid: u32| crate::sys::process::state_of(pid).is_some_and(|s| s != 'Z' && s != 'X');
        if !self.discovered.running().into_iter().any(alive) {
            self.command.ended = Some(at);
        }
    }

    /// Follows the processes of the command's tree that started before the kernel followed
    /// their parent (no fork event tells of them), as new processes of the command; none
    /// under `--no-follow` (their records are then dropped as their probes' samples would
    /// be).
    ///
    /// Each pass lists the tree in /proc, then the family table's claims, in that order: a
    /// process forked before its parent was followed is either still there when /proc is
    /// listed, or gone, and then it claimed its slot (if its program carried the library)
    /// before it exited, so before the claims are read. Read the other way round, a child
    /// forked just before the command was followed, that claimed its slot after the claims
    /// were read and exited before /proc was listed, was missing from the recording without
    /// a word (1 shell loop of 15 lost one of its 150 processes). A process found is
    /// followed only then: its own children forked meanwhile are the next pass's.
    fn follow_tree(&mut self) {
        let Some(command) = self.command.pid else {
            return;
        };
        if !self.targets.follow {
            return;
        }
        let mut seen = std::collections::HashSet::from([command]);
        for _ in 0..TREE_PASSES {
            // Also those that claimed no slot: in another pid namespace (`unshare --pid`),
            // or that found the table full.
            let mut found = crate::sys::process::descendants(command);
            if let Some(family) = self.in_process.family() {
                found.extend(family.members());
            }
            found.sort_unstable();
            found.retain(|&pid| seen.insert(pid));
            if found.is_empty() {
                return;
            }
            self.follow_members(command, &found);
        }
    }

    /// Follows `members`, processes of `command`'s tree, as its new processes.
    fn follow_members(&mut self, command: u32, members: &[u32]) {
        let now = crate::collect::monotonic_ns();
        for &pid in members {
            if self.discovered.is_running(pid) {
                continue;
            }
            if let Some(probes) = self.probes.as_mut() {
                if let Err(e) = probes.follow(pid) {
                    warn!("pid {pid}: not followed: {e}");
                    continue;
                }
            }
            let comm = crate::sys::process::comm_of(pid).unwrap_or_default();
            self.on_process(pid, command, now, &comm);
        }
    }
}

/// Whether two command names are the same as the kernel keeps them (15 bytes).
fn same_comm(a: &str, b: &str) -> bool {
    let cut = |s: &str| s.as_bytes()[..s.len().min(15)].to_vec();
    cut(a) == cut(b)
}
