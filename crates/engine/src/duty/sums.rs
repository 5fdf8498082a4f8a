//! Sums of a duty-cycled recording (`--max-overhead`): per stack, the samples of the
//! current stratum's on slot, and over the strata closed so far a [`DutyTotal`] of bytes
//! and one of objects; per process the same from the kernel's exact counters, which count
//! the on slots only. Each stratum's on slot stands for its whole stratum, scaled by the
//! target's own work in the stratum over that in the slot ([`crate::duty::estimate`]).
//!
//! Each stratum's work is the target's (its CPU time, on and off: see
//! [`crate::duty::estimate`]), so a stack is summed against its process's work. Every stack
//! and process is given every stratum, with nothing observed where it had nothing, so
//! that all of a process share the same strata (and the same groups for the variance): a
//! stack first seen late starts from a copy of its process's all-zero total.

use std::collections::BTreeMap;

use sampler_common::ProcessCounters;

use crate::{
    duty::estimate::{DutyTotal, SlotTotal, StratumWork},
    stacks::StackId,
    stats::{SampleObs, SampleSet},
};

/// How each target worked over one stratum (see [`StratumWork`]), and its slots.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StratumObserved {
    /// Slots in the stratum (1: always on).
    pub slots: f64,
    /// Per target.
    pub work: BTreeMap<u32, StratumWork>,
    /// The probes' cost per call meanwhile.
    pub ns_per_call: f64,
}

impl StratumObserved {
    /// `pid`'s work (none: it did nothing, or was not a target yet).
    fn of(&self, pid: u32) -> StratumWork {
        self.work.get(&pid).copied().unwrap_or(StratumWork {
            slots: self.slots,
            cpu: 0.0,
            on_cpu: 0.0,
            on_calls: 0.0,
        })
    }
}

/// A total of bytes and one of objects (or calls).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DutyPair {
    /// Bytes.
    pub bytes: DutyTotal,
    /// Objects (a stack) or calls (a process).
    pub objects: DutyTotal,
}

/// One stack's sums.
#[derive(Clone, Debug)]
struct StackSums {
    pid: u32,
    closed: DutyPair,
    open: SampleSet,
}

/// The duty-cycled sums of a recording.
#[derive(Clone, Debug, Default)]
pub(crate) struct DutySums {
    /// Per target: every stratum closed so far, with its work and nothing observed.
    zero: BTreeMap<u32, DutyPair>,
    /// Per stack (by id; `None`: a stack of no sample yet).
    stacks: Vec<Option<StackSums>>,
    /// Per target: the closed strata (from exact counts).
    processes: BTreeMap<u32, DutyPair>,
    /// The exact counters when the last stratum closed.
    counted: BTreeMap<u32, ProcessCounters>,
}

impl DutySums {
    /// A sample of `stack`, of process `pid` (taken in the current stratum's on slot: the
    /// kernel samples nothing outside one).
    pub(crate) fn add(&mut self, stack: StackId, pid: u32, obs: SampleObs) {
        let id = stack as usize;
        if self.stacks.len() <= id {
            self.stacks.resize(id + 1, None);
        }
        let zero = &self.zero;
        self.stacks[id]
            .get_or_insert_with(|| StackSums {
                pid,
                closed: zero.get(&pid).cloned().unwrap_or_default(),
                open: SampleSet::default(),
            })
            .open
            .add(obs);
    }

    /// Closes the current stratum as `observed`, with every target's exact counters now
    /// (cumulative: what they grew by since the last close is this stratum's).
    pub(crate) fn close(
        &mut self,
        observed: &StratumObserved,
        counters: &BTreeMap<u32, ProcessCounters>,
    ) {
        for stack in self.stacks.iter_mut().flatten() {
            let work = observed.of(stack.pid);
            add(
                &mut stack.closed,
                work,
                observed.ns_per_call,
                SlotTotal::of_samples(&stack.open),
            );
            stack.open = SampleSet::default();
        }
        let pids: std::collections::BTreeSet<u32> = observed
            .work
            .keys()
            .chain(counters.keys())
            .chain(self.processes.keys())
            .copied()
            .collect();
        for pid in pids {
            let work = observed.of(pid);
            let grown = self.grown(pid, counters.get(&pid).copied().unwrap_or_default());
            let zero = self.zero.entry(pid).or_default();
            let mut pair = self.processes.remove(&pid).unwrap_or_else(|| zero.clone());
            add(&mut pair, work, observed.ns_per_call, grown);
            let nothing = (SlotTotal::exact(0), SlotTotal::exact(0));
            add(zero, work, observed.ns_per_call, nothing);
            self.processes.insert(pid, pair);
        }
        for (&pid, &now) in counters {
            self.counted.insert(pid, now);
        }
    }

    /// What `pid`'s exact counters grew by since the last close, now `counters`.
    fn grown(&self, pid: u32, counters: ProcessCounters) -> (SlotTotal, SlotTotal) {
        let before = self.counted.get(&pid).copied().unwrap_or_default();
        (
            SlotTotal::exact(counters.bytes.saturating_sub(before.bytes)),
            SlotTotal::exact(counters.calls.saturating_sub(before.calls)),
        )
    }

    /// `stack`'s totals with the current stratum, as `open` so far, added.
    pub(crate) fn stack(&self, stack: StackId, open: &StratumObserved) -> Option<DutyPair> {
        let sums = self.stacks.get(stack as usize)?.as_ref()?;
        Some(with(
            &sums.closed,
            open,
            sums.pid,
            SlotTotal::of_samples(&sums.open),
        ))
    }

    /// `pid`'s totals of bytes and calls with the current stratum, as `open` so far, added
    /// (its exact counters now are `counters`).
    pub(crate) fn process(
        &self,
        pid: u32,
        counters: ProcessCounters,
        open: &StratumObserved,
    ) -> DutyPair {
        let closed = self
            .processes
            .get(&pid)
            .or_else(|| self.zero.get(&pid))
            .cloned()
            .unwrap_or_default();
        with(&closed, open, pid, self.grown(pid, counters))
    }
}

fn add(
    pair: &mut DutyPair,
    work: StratumWork,
    ns_per_call: f64,
    (bytes, objects): (SlotTotal, SlotTotal),
) {
    pair.bytes.add_stratum(work, bytes, ns_per_call);
    pair.objects.add_stratum(work, objects, ns_per_call);
}

fn with(
    pair: &DutyPair,
    open: &StratumObserved,
    pid: u32,
    totals: (SlotTotal, SlotTotal),
) -> DutyPair {
    let mut pair = pair.clone();
    if open.slots > 0.0 {
        add(&mut pair, open.of(pid), open.ns_per_call, totals);
    }
    pair
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT: f64 = 0.1;

    /// A stratum of `slots` in which target 7 worked at a steady pace (time as the work).
    fn stratum(slots: u32, on_calls: f64) -> StratumObserved {
        let m = f64::from(slots);
        StratumObserved {
            slots: m,
            ns_per_call: 0.0,
            work: BTreeMap::from([(
                7,
                StratumWork {
                    slots: m,
                    cpu: m * SLOT,
                    on_cpu: SLOT,
                    on_calls,
                },
            )]),
        }
    }

    fn counts(calls: u64, bytes: u64) -> ProcessCounters {
        ProcessCounters { calls, bytes }
    }

    #[test]
    fn exact_counts_are_weighted_per_stratum() {
        let mut sums = DutySums::default();
        // Stratum 1 (always on): 100 calls; 2 and 3 (one slot in 4): 10 and 30 more.
        sums.close(
            &stratum(1, 100.0),
            &BTreeMap::from([(7, counts(100, 1000))]),
        );
        sums.close(&stratum(4, 10.0), &BTreeMap::from([(7, counts(110, 1100))]));
        sums.close(&stratum(4, 30.0), &BTreeMap::from([(7, counts(140, 1400))]));
        let pair = sums.process(7, counts(140, 1400), &StratumObserved::default());
        // Free probes (κ = 0): Horvitz-Thompson over time.
        let calls = pair.objects.estimate(0.95, 0.0);
        assert!((calls.estimate - (100.0 + 4.0 * 10.0 + 4.0 * 30.0)).abs() < 1e-9);
        // Certain part exact; the two sampled strata differ: the bounds are wide but hold
        // what was seen.
        assert!(calls.lower >= 140.0 && calls.upper > calls.estimate);
        let bytes = pair.bytes.estimate(0.95, 0.0).estimate;
        assert!((bytes - (1000.0 + 400.0 + 1200.0)).abs() < 1e-6);
        assert!((pair.objects.coverage(0.0) - 0.3 / 0.9).abs() < 1e-12);
    }

    #[test]
    fn a_stack_seen_late_shares_the_strata_of_the_others() {
        let mut sums = DutySums::default();
        let obs = SampleObs {
            size: 1 << 20,
            offset: 0,
            interval: 1024,
            weight: None,
        };
        let none = BTreeMap::new();
        sums.add(0, 7, obs);
        sums.close(&stratum(4, 1.0), &none);
        sums.add(0, 7, obs);
        sums.close(&stratum(4, 1.0), &none);
        sums.add(3, 7, obs);
        sums.close(&stratum(4, 1.0), &none);
        let open = StratumObserved::default();
        let early = sums.stack(0, &open).unwrap();
        let late = sums.stack(3, &open).unwrap();
        assert_eq!(early.bytes.strata(), 3);
        assert_eq!(late.bytes.strata(), 3);
        // A 1 MiB object at a 1 KiB interval is always sampled: each on slot's is 4 MiB.
        let mib = 1048576.0;
        assert!((early.bytes.estimate(0.95, 0.0).estimate - 8.0 * mib).abs() < 1.0);
        assert!((late.bytes.estimate(0.95, 0.0).estimate - 4.0 * mib).abs() < 1.0);
        assert!(sums.stack(9, &open).is_none());
        // The current stratum's samples count, weighted, in a snapshot.
        sums.add(3, 7, obs);
        let now = sums.stack(3, &stratum(2, 1.0)).unwrap();
        assert!((now.bytes.estimate(0.95, 0.0).estimate - 6.0 * mib).abs() < 1.0);
    }
}
