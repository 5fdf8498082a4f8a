//! Duty cycling's state in a recording: the plan being played, each target's CPU clock
//! over strata and on slots, the controller that chooses the strata's length from what the
//! probes added, and what the profile says of it. The recording's driver
//! (`recording::duty_cycling`) opens and closes the gate at the slot boundaries and hands
//! this the clocks' and counters' readings.

use std::{collections::BTreeMap, time::Duration};

use log::{debug, info};
use sampler_common::ProcessCounters;

use super::{
    estimate::StratumWork,
    plan::{self, Plan, Stratum},
    sums::StratumObserved,
};
use crate::{
    schema::{DutyRecord, OnSlot},
    sys::clock::monotonic_ns,
};

/// Length of a slot. Attaching a process's probes takes a few milliseconds (measured: `-v`
/// logs it; docs/performance.md, "Figures quoted from the code") and detaching runs in the
/// background, so a slot of 50 ms loses a tenth of itself to attaching (the gate opens
/// after; the target pays the trap meanwhile, uncounted), and
/// strata stay short enough that a recording of half a minute has dozens of them at one
/// slot on in 20, and bounds.
pub const SLOT: Duration = Duration::from_millis(50);

/// The controller's windows: the first, with the probes always on, is short (a malloc
/// storm pays ~100 times its own time meanwhile; the targets' CPU clocks are read to the
/// nanosecond); later ones span a couple of seconds (and whole strata).
const FIRST_WINDOW_SECONDS: f64 = 0.1;
const WINDOW_SECONDS: f64 = 2.0;

/// One target's CPU clock readings, in nanoseconds.
#[derive(Clone, Copy, Debug, Default)]
struct Clock {
    /// Last reading (kept once the process is gone).
    last: u64,
    /// At the current stratum's start.
    stratum: u64,
    /// While the gate is open: at its opening, and the calls counted then.
    open: Option<(u64, u64)>,
    /// CPU time and calls in the current stratum's on slot so far.
    on_cpu: u64,
    on_calls: u64,
    /// Over every on slot: CPU time and calls (the CPU per call of a target that exited
    /// during an on slot, its clock gone, stands in for what it did after the last read).
    all_on_cpu: u64,
    all_on_calls: u64,
    /// CPU time so estimated, beyond `last`.
    extra: u64,
    /// Its clock could not be read (the process is gone).
    gone: bool,
}

impl Clock {
    /// CPU time and calls since the gate opened at `open`, `now_calls` counted now; for a
    /// process gone, its CPU after the last reading estimated from its calls.
    fn since(&mut self, (cpu, calls): (u64, u64), now_calls: u64) -> (u64, u64) {
        let calls = now_calls.saturating_sub(calls);
        let mut used = (self.last + self.extra).saturating_sub(cpu);
        if self.gone && self.all_on_calls > 0 {
            let estimated =
                (calls as f64 * self.all_on_cpu as f64 / self.all_on_calls as f64) as u64;
            if estimated > used {
                self.extra += estimated - used;
                used = estimated;
            }
        }
        (used, calls)
    }
}

/// The duty cycle's state in a recording.
pub struct DutyCycling {
    budget: f64,
    plan: Plan,
    /// The stratum being played (the plan moves on at its last slot's start).
    current: Stratum,
    started_ns: u64,
    /// When the gate opened, while it is open.
    gate_opened_ns: Option<u64>,
    /// Per target.
    clocks: BTreeMap<u32, Clock>,
    /// Slots of the strata from now on, as the controller last chose.
    slots: u32,
    /// Since when the controller measures: (ns, the targets' CPU seconds, calls counted).
    window: Option<(u64, f64, u64)>,
    on_slots: Vec<OnSlot>,
    on_slots_not_listed: u64,
    largest: u32,
    observed_ns: u64,
    attach_ns: u64,
    attaches: u64,
}

impl DutyCycling {
    /// Keeps the probes' cost within `budget` (a fraction of the targets' own CPU). Its
    /// first slot is on from now: the caller opens the gate before any target runs.
    pub fn new(budget: f64) -> DutyCycling {
        let now = monotonic_ns();
        let mut plan = Plan::new();
        plan.advance(|| Stratum::draw(1, 0));
        DutyCycling {
            budget,
            current: plan.stratum(),
            plan,
            started_ns: now,
            gate_opened_ns: Some(now),
            clocks: BTreeMap::new(),
            slots: 1,
            window: None,
            on_slots: Vec::new(),
            on_slots_not_listed: 0,
            largest: 1,
            observed_ns: 0,
            attach_ns: 0,
            attaches: 0,
        }
    }

    /// Moves the plan on to the next slot (a new stratum drawn at random when one ends: the
    /// on slot's place must not follow the workload).
    pub(crate) fn advance(&mut self) -> plan::SlotStart {
        let slots = self.slots;
        let mut random = [0u8; 8];
        getrandom(&mut random);
        self.plan
            .advance(|| Stratum::draw(slots, u64::from_ne_bytes(random)))
    }

    /// Whether the gate is open (the probes count and sample).
    pub(crate) fn gate_is_open(&self) -> bool {
        self.gate_opened_ns.is_some()
    }

    /// What the profile says of the duty cycle.
    pub fn record(&self, now_ns: u64) -> DutyRecord {
        let open = self
            .gate_opened_ns
            .map_or(0, |at| now_ns.saturating_sub(at));
        let elapsed = now_ns.saturating_sub(self.started_ns).max(1);
        DutyRecord {
            max_overhead: self.budget,
            slot_seconds: SLOT.as_secs_f64(),
            strata: self.plan.strata() + 1,
            observed_share: ((self.observed_ns + open) as f64 / elapsed as f64).min(1.0),
            largest_stratum_slots: self.largest,
            on_slots: self.on_slots.clone(),
            on_slots_not_listed: self.on_slots_not_listed,
        }
    }

    /// Reads the CPU clocks of `pids` (targets now), taking in new ones from now on.
    pub(crate) fn read_clocks(&mut self, pids: impl IntoIterator<Item = u32>) {
        for pid in pids {
            let clock = self.clocks.entry(pid).or_default();
            match crate::sys::clock::process_cpu_ns(pid) {
                Some(ns) if !clock.gone => {
                    if clock.last == 0 {
                        // New: its work counts from now.
                        clock.stratum = ns;
                    }
                    clock.last = ns;
                }
                _ => clock.gone = true,
            }
        }
    }

    /// The gate opened (the clocks just read), `counters` counted then.
    pub(crate) fn gate_opened(&mut self, now: u64, counters: &BTreeMap<u32, ProcessCounters>) {
        self.gate_opened_ns = Some(now);
        for (pid, clock) in &mut self.clocks {
            let calls = counters.get(pid).map_or(0, |c| c.calls);
            clock.open = Some((clock.last + clock.extra, calls));
        }
    }

    /// The gate closed at `now` (the clocks just read), `counters` counted then.
    pub(crate) fn gate_closed(&mut self, now: u64, counters: &BTreeMap<u32, ProcessCounters>) {
        let opened = self.gate_opened_ns.take().unwrap_or(now);
        for (pid, clock) in &mut self.clocks {
            if let Some(open) = clock.open.take() {
                let now_calls = counters.get(pid).map_or(open.1, |c| c.calls);
                let (cpu, calls) = clock.since(open, now_calls);
                clock.on_cpu += cpu;
                clock.on_calls += calls;
                clock.all_on_cpu += cpu;
                clock.all_on_calls += calls;
            }
        }
        let seconds = now.saturating_sub(opened) as f64 / 1e9;
        self.observed_ns += now.saturating_sub(opened);
        let listed = OnSlot {
            at_seconds: opened.saturating_sub(self.started_ns) as f64 / 1e9,
            seconds,
            stratum_slots: self.current.slots,
        };
        if self.on_slots.len() < DutyRecord::LISTED {
            self.on_slots.push(listed);
        } else {
            self.on_slots_not_listed += 1;
        }
    }

    /// Each target's work in the current stratum so far (the gate's open part included,
    /// with `counters` counted now), the probes costing `ns_per_call`.
    pub(crate) fn observed(
        &self,
        counters: &BTreeMap<u32, ProcessCounters>,
        ns_per_call: f64,
    ) -> StratumObserved {
        let slots = f64::from(self.current.slots);
        let work = self
            .clocks
            .iter()
            .map(|(&pid, clock)| {
                let mut clock = *clock;
                let (mut on_cpu, mut on_calls) = (clock.on_cpu, clock.on_calls);
                if let Some(open) = clock.open {
                    let now_calls = counters.get(&pid).map_or(open.1, |c| c.calls);
                    let (cpu, calls) = clock.since(open, now_calls);
                    on_cpu += cpu;
                    on_calls += calls;
                }
                let work = StratumWork {
                    slots,
                    cpu: (clock.last + clock.extra).saturating_sub(clock.stratum) as f64 / 1e9,
                    on_cpu: on_cpu as f64 / 1e9,
                    on_calls: on_calls as f64,
                };
                (pid, work)
            })
            .collect();
        StratumObserved {
            slots,
            work,
            ns_per_call,
        }
    }

    /// The stratum ended (the clocks just read): how it was observed, and a new one begins.
    pub(crate) fn end_stratum(
        &mut self,
        counters: &BTreeMap<u32, ProcessCounters>,
        ns_per_call: f64,
    ) -> StratumObserved {
        let observed = self.observed(counters, ns_per_call);
        for (pid, work) in &observed.work {
            debug!(
                "duty cycle: stratum of {} slots: pid {pid} used {:.1} ms of CPU, {:.1} ms in \
                 its on slot with {} calls",
                work.slots,
                work.cpu * 1e3,
                work.on_cpu * 1e3,
                work.on_calls
            );
        }
        for clock in self.clocks.values_mut() {
            clock.stratum = clock.last + clock.extra;
            clock.on_cpu = 0;
            clock.on_calls = 0;
        }
        self.current = self.plan.stratum();
        self.largest = self.largest.max(self.current.slots);
        observed
    }

    /// Chooses the next strata's size when the window since the last choice is long
    /// enough: from the share of their own CPU time the probes added to the targets in it.
    pub(crate) fn choose(&mut self, now: u64, calls: u64, ns_per_call: f64) {
        let cpu = self.clocks.values().map(|c| c.last + c.extra).sum::<u64>() as f64 / 1e9;
        let Some((since, cpu_then, calls_then)) = self.window else {
            self.window = Some((now, cpu, calls));
            return;
        };
        let seconds = now.saturating_sub(since) as f64 / 1e9;
        let current = self.slots;
        let long_enough = if current <= 1 {
            FIRST_WINDOW_SECONDS
        } else {
            WINDOW_SECONDS
        };
        if seconds < long_enough {
            return;
        }
        let added = calls.saturating_sub(calls_then) as f64 * ns_per_call * 1e-9;
        let own = (cpu - cpu_then) - added;
        let share = if own > 0.0 {
            added / own
        } else if added > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        self.slots = plan::next_slots(self.budget, current, share);
        if self.slots != current {
            debug!(
                "duty cycle: the probes added {:.1}% to the targets' own CPU time over \
                 {seconds:.1} s: one slot in {} on from now (was {current})",
                share * 100.0,
                self.slots
            );
        }
        self.window = Some((now, cpu, calls));
    }

    /// Attaching for an on slot took `ns`.
    pub(crate) fn attached(&mut self, ns: u64) {
        debug!("duty cycle: attached in {:.2} ms", ns as f64 / 1e6);
        self.attach_ns += ns;
        self.attaches += 1;
        if self.attaches.is_power_of_two() {
            info!(
                "duty cycle: attaching takes {:.2} ms on average ({} on slots)",
                self.attach_ns as f64 / self.attaches as f64 / 1e6,
                self.attaches
            );
        }
    }
}

/// Fills `bytes` from the kernel's random pool (the on slot's draw must not follow the
/// workload); zeros if it fails, which only makes the draw predictable.
fn getrandom(bytes: &mut [u8]) {
    // SAFETY: getrandom(2) writes at most `len` bytes into the buffer it is given.
    let _ = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
}
