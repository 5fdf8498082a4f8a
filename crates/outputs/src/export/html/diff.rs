//! The data of `allocscope diff A B -o diff.html`: a differential flame graph, each frame as
//! wide as the larger of its two sides and coloured only where its change is significant.
//!
//! Each stack's change comes from [`crate::diff`] with bounds simultaneous over all its
//! comparisons (Bonferroni); the page reads it back as a change and one standard error on
//! each side at that `z`, adds a frame's stacks in quadrature (independent samples), and
//! calls the sum significant when its bounds exclude zero, the rule a stack's own change
//! follows.

use super::data::{path_of_frames, Data, Metric, Names, StackData};
use crate::{
    diff::{Basis, Compared, Diff},
    stats::difference::{self, Change},
};

/// `[change, below, above, width, base, new]` for the page.
fn values(change: &Change, base: f64, new: f64, z: f64) -> Vec<f64> {
    vec![
        change.estimate,
        ((change.estimate - change.lower) / z).max(0.0),
        ((change.upper - change.estimate) / z).max(0.0),
        base.max(new),
        base,
        new,
    ]
}

/// The page's data for `diff` (`base` and `new` name the two files).
pub fn diff_data(diff: &Diff, base: &str, new: &str) -> Data {
    let alpha = 1.0 - diff.confidence;
    let z = difference::z(1.0 - alpha / diff.comparisons.max(1) as f64);
    let inuse = diff.stacks.iter().any(|c| c.inuse_change.is_some());
    let mut metrics = vec![match diff.basis {
        Basis::PerRun => Metric {
            key: "alloc_bytes",
            label: "allocated bytes per run",
            unit: "bytes",
            signed: true,
        },
        Basis::PerSecond => Metric {
            key: "alloc_rate",
            label: "allocated bytes per second",
            unit: "bytes/s",
            signed: true,
        },
    }];
    if inuse {
        metrics.push(Metric {
            key: "inuse_bytes",
            label: "live bytes at the end",
            unit: "bytes",
            signed: true,
        });
    }
    let mut names = Names::default();
    let stacks = diff
        .stacks
        .iter()
        .map(|c: &Compared| {
            let command = c.commands.join(", ");
            let command = command.as_str();
            let mut v = vec![Some(values(&c.alloc_change, c.base_alloc, c.new_alloc, z))];
            if inuse {
                v.push(c.inuse_change.map(|change| {
                    values(
                        &change,
                        c.base_inuse.unwrap_or(0.0),
                        c.new_inuse.unwrap_or(0.0),
                        z,
                    )
                }));
            }
            StackData {
                f: path_of_frames(&mut names, command, &c.frames),
                site: super::data::site_in_path(&c.frames),
                s: 0,
                v,
                life: None,
                sizes: Vec::new(),
                threads: Vec::new(),
            }
        })
        .collect();
    Data {
        kind: "diff",
        title: format!("allocscope diff: {base} → {new}"),
        preamble: crate::diff::render::table(diff, base, new),
        confidence: diff.confidence,
        z,
        metrics,
        first: 0,
        frames: names.names,
        stacks,
        series: Vec::new(),
        at_seconds: Vec::new(),
        sizes: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_that_grew_carries_its_change_and_both_sides() {
        let base = allocscope_model::fixtures::synthetic();
        let mut new = base.clone();
        new.stacks[0].alloc_bytes.estimate *= 10.0;
        new.stacks[0].alloc_bytes.lower *= 10.0;
        new.stacks[0].alloc_bytes.upper *= 10.0;
        let found = crate::diff::diff(&base, &new, 0.95, false, None);
        let data = diff_data(&found, "a.json", "b.json");
        assert_eq!(data.kind, "diff");
        assert!(data.z > difference::z(0.95), "Bonferroni widens z");
        let grown = data
            .stacks
            .iter()
            .find(|s| {
                s.f.iter()
                    .any(|&i| data.frames[i as usize] == "inlined_leaf")
            })
            .unwrap();
        let v = grown.v[0].as_ref().unwrap();
        assert!(
            v[0] > 0.0 && v[0] - data.z * v[1] > 0.0,
            "significant: {v:?}"
        );
        assert_eq!(v[3], v[5], "as wide as its new side");
        assert_eq!(data.frames[grown.f[0] as usize], "app");
    }
}
