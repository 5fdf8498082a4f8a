//! Duty cycling's driver in a running recording (`--max-overhead`; the feature's state and
//! plan are [`crate::duty`]):
//! at every slot boundary the gate closes and the probes are taken out after an on slot,
//! and put back in before the next one; when a stratum ends, its samples, exact counts and
//! each target's work (CPU time over the stratum and over its on slot, read from the
//! process's CPU clock) go to the aggregator's per-stratum sums, and the controller
//! chooses the size of the strata to come from what the probes added.
//!
//! **Order at the end of an on slot:** close the gate (the kernel counts and samples
//! nothing from now on, so the slot's edge is exact), read the targets' CPU clocks and
//! the exact counters, catch up on the ring buffer (every sample of the slot is in), then
//! detach in the background (removing breakpoints waits for the kernel's grace periods).
//! **At the start of one:** attach (a few milliseconds, measured), then open the gate and
//! read the clocks and counters: the slot begins there.

use std::collections::BTreeMap;

use anyhow::Context as _;
use sampler_common::ProcessCounters;

use super::Recording;
use crate::{collect::monotonic_ns, duty::DutyCycling, profile::OpenStratum};

impl Recording {
    /// At a slot boundary: ends an on slot, a stratum, starts the next slot.
    pub(super) async fn duty_slot(&mut self) -> anyhow::Result<()> {
        if self.probes.is_none() {
            return Ok(());
        }
        // Taken out for the step (and put back whatever happens): the step reads the
        // kernel through the recording while it moves the duty cycle on.
        let Some(mut duty) = self.cost.duty.take() else {
            return Ok(());
        };
        let stepped = self.duty_step(&mut duty).await;
        self.cost.duty = Some(duty);
        stepped
    }

    async fn duty_step(&mut self, duty: &mut DutyCycling) -> anyhow::Result<()> {
        let pids = self.discovered.running();
        let start = duty.advance();
        // Back-to-back on slots (strata of one): the gate stays open, the probes in.
        let keep_on = start.was_on && start.on;
        if start.was_on && !keep_on {
            // Closed first: nothing is counted or sampled after this moment.
            self.probes_mut()?
                .set_gate(false)
                .context("closing the duty cycle's gate")?;
        }
        let now = monotonic_ns();
        duty.read_clocks(pids.iter().copied());
        let Some((counters, _)) = self.exact_counts()? else {
            return Ok(());
        };
        if start.was_on {
            duty.gate_closed(now, &counters);
            if !keep_on {
                self.probes_mut()?.suspend().close_in_background();
            }
            self.catch_up().await?;
        }
        if start.ended.is_some() {
            let ns_per_call = self.ns_per_call();
            let calls: u64 = counters.values().map(|c| c.calls).sum();
            let observed = duty.end_stratum(&counters, ns_per_call);
            self.aggregation.close_stratum(&observed, &counters);
            duty.choose(now, calls, ns_per_call);
        }
        if keep_on {
            duty.gate_opened(now, &counters);
        } else if start.on {
            let probes = self.probes_mut()?;
            probes
                .resume()
                .context("attaching the probes for an on slot")?;
            probes
                .set_gate(true)
                .context("opening the duty cycle's gate")?;
            let opened = monotonic_ns();
            duty.attached(opened - now);
            duty.read_clocks(pids.iter().copied());
            // The gate was closed since the counters were read: they are the same now.
            duty.gate_opened(opened, &counters);
        }
        Ok(())
    }

    /// Duty cycling: how the current stratum was observed until now (with the counters read
    /// last), and the probes' cost per call, for the next tally.
    pub(super) fn open_stratum(&mut self) -> Option<OpenStratum> {
        let pids = self.discovered.running();
        let ns_per_call = self.ns_per_call();
        let counters = self
            .accounting
            .last
            .as_ref()
            .map(|(counters, _)| counters.clone())
            .unwrap_or_default();
        let detached = self.probes.is_none();
        let duty = self.cost.duty.as_mut()?;
        if !detached {
            // Detached: the clocks read at detaching stand (see `Recording::detach`).
            duty.read_clocks(pids);
        }
        Some(OpenStratum {
            observed: duty.observed(&counters, ns_per_call),
            counters,
            ns_per_call,
        })
    }

    /// Duty cycling: target `pid` exited; its CPU clock is read while it can be (a child of
    /// ours stays readable until reaped).
    pub(super) fn duty_exit(&mut self, pid: u32) {
        if let Some(duty) = self.cost.duty.as_mut() {
            duty.read_clocks([pid]);
        }
    }

    /// Duty cycling, detaching: the gate's last open stretch ends now.
    pub(super) fn end_duty(&mut self, counters: &BTreeMap<u32, ProcessCounters>) {
        let pids = self.discovered.running();
        if let Some(duty) = self.cost.duty.as_mut() {
            let now = monotonic_ns();
            duty.read_clocks(pids);
            if duty.gate_is_open() {
                duty.gate_closed(now, counters);
            }
        }
    }
}
