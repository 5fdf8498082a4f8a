//! A program's allocation sites: its stacks summed at their site (their first frame past
//! the allocator and the runtimes' allocation machinery, [`crate::stacks::site`]).
//!
//! Why: one leak is often several stacks (a Python line reached through three interpreter
//! paths, a function called from two places), each growing too slowly, or sampled too
//! thinly, to be shown growing on its own, while the site as a whole plainly leaks. A
//! site's estimates come from its stacks' samples taken together (sample sets and growth
//! sums merged), so its bounds are those of the sum.

use std::collections::BTreeMap;

use super::tally::StackTally;
use crate::stats::{growth::GrowthSums, SampleSet};

/// One site's stacks, summed.
#[derive(Debug, Default)]
pub(super) struct SiteSums<'a> {
    /// Its largest stack by samples (whose frames the site is shown with).
    pub largest: Option<&'a StackTally>,
    /// Its site's index in that stack's frames.
    pub site: usize,
    pub stacks: u64,
    pub all: SampleSet,
    pub live: SampleSet,
    pub at_peak: SampleSet,
    pub growth: GrowthSums,
}

/// The stacks of `tallied` summed per (pid, site name), in no particular order; the lost
/// samples' pseudo-stacks left out.
pub(super) fn by_site(tallied: &[StackTally]) -> Vec<SiteSums<'_>> {
    let sites = crate::stacks::site::sites();
    let mut by: BTreeMap<(u32, String), SiteSums> = BTreeMap::new();
    for stack in tallied.iter().filter(|s| !s.lost && !s.frames.is_empty()) {
        let site = sites.site_of(&stack.frames);
        let name = crate::format::frame_name(&stack.frames[site]);
        let sums = by.entry((stack.pid, name)).or_default();
        if sums
            .largest
            .is_none_or(|l| l.all.samples() < stack.all.samples())
        {
            sums.largest = Some(stack);
            sums.site = site;
        }
        sums.stacks += 1;
        sums.all.merge(&stack.all);
        sums.live.merge(&stack.live);
        sums.at_peak.merge(&stack.at_peak);
        sums.growth.merge(&stack.growth);
    }
    by.into_values().collect()
}
