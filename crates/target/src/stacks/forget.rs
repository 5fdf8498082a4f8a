//! Forgetting processes that are gone, for a recording that runs for days (the agent
//! under `--all`): every process that ever allocated would otherwise keep its maps, its
//! unwinder and its stacks in the table for good, and the table's `--max-stacks` would fill
//! with the dead, cutting every new process's stacks to their leaf.

use std::collections::BTreeSet;

use super::{StackId, StackTable};

impl StackTable {
    /// Drops the stacks of the processes in `gone`, and their maps and unwinders. The
    /// stacks kept are renumbered densely in their old order; returns, per old id, the new
    /// one (`None`: dropped), for the holders of per-stack data to follow.
    pub fn forget(&mut self, gone: &BTreeSet<u32>) -> Vec<Option<StackId>> {
        for pid in gone {
            self.maps.remove(pid);
            self.unwinders.forget(*pid);
        }
        let mut remap = Vec::with_capacity(self.stacks.len());
        let mut kept = Vec::with_capacity(self.stacks.len());
        for key in std::mem::take(&mut self.stacks) {
            if gone.contains(&key.0) {
                remap.push(None);
            } else {
                remap.push(Some(kept.len() as StackId));
                kept.push(key);
            }
        }
        self.stacks = kept;
        self.index = self
            .stacks
            .iter()
            .enumerate()
            .map(|(id, key)| (key.clone(), id as StackId))
            .collect();
        self.cut = self
            .cut
            .iter()
            .filter_map(|&id| remap.get(id as usize).copied().flatten())
            .collect();
        remap
    }
}

/// Keeps the entries of `per_stack` (indexed by old stack id) whose stack `remap` keeps,
/// in order: entry `i` of the result belongs to new id `i`.
pub fn retain_remapped<T>(per_stack: &mut Vec<T>, remap: &[Option<StackId>]) {
    let mut old = 0;
    per_stack.retain(|_| {
        let keep = remap.get(old).is_none_or(Option::is_some);
        old += 1;
        keep
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::{tests::raw, StackTable};

    #[test]
    fn a_gone_process_leaves_no_stack_and_the_others_keep_theirs() {
        let mut table = StackTable::default();
        let a1 = raw(&mut table, 1, &[1, 2]);
        let b = raw(&mut table, 2, &[1, 2]);
        let a2 = raw(&mut table, 1, &[3]);
        let c = raw(&mut table, 3, &[4, 5]);
        let before = (table.stack(b).1.to_vec(), table.stack(c).1.to_vec());
        let remap = table.forget(&BTreeSet::from([1]));
        assert_eq!(remap, [None, Some(0), None, Some(1)]);
        assert_eq!((a1, a2), (0, 2));
        assert_eq!(table.stack(0).0, 2);
        assert_eq!(table.stack(1).0, 3);
        assert_eq!(
            (table.stack(0).1.to_vec(), table.stack(1).1.to_vec()),
            before
        );
        // Interning again finds the kept stacks under their new ids, and a new stack of a
        // new process with the gone one's pid gets a new id.
        assert_eq!(raw(&mut table, 2, &[1, 2]), 0);
        assert_eq!(raw(&mut table, 1, &[1, 2]), 2);
        let mut per_stack = vec!["a1", "b", "a2", "c"];
        retain_remapped(&mut per_stack, &remap);
        assert_eq!(per_stack, ["b", "c"]);
    }
}
