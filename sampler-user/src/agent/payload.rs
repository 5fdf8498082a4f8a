//! The pprof message the agent sends for one process's period: the pprof export's message
//! (Go's heap sample types, so stores show `alloc_space`/`inuse_space`), stamped with the
//! period's start and length, and carrying each stack's bounds.
//!
//! A store that shows only the point values must not lose the bounds silently: every sample
//! carries numeric labels `alloc_space_lower`/`_upper` (and `inuse_space_…` when frees are
//! tracked), unit bytes, at the confidence a comment states. Both sinks start from this
//! message: Pyroscope takes it as is, OTLP converts it (`otlp`).

use crate::export::pprof::{self, proto};

use super::period::ProcessPeriod;

/// Label keys of the bounds, in the order [`bounded`] adds them.
pub(crate) const BOUND_LABELS: [&str; 4] = [
    "alloc_space_lower",
    "alloc_space_upper",
    "inuse_space_lower",
    "inuse_space_upper",
];

/// The period's pprof message for `period`, which started at `start_unix_ns`.
pub(crate) fn bounded(period: &ProcessPeriod, start_unix_ns: i64) -> proto::Profile {
    let profile = &period.profile;
    let mut message = pprof::build(profile);
    message.time_nanos = start_unix_ns;
    message.duration_nanos = (profile.duration_seconds * 1e9) as i64;
    let intern = |table: &mut Vec<String>, text: &str| -> i64 {
        match table.iter().position(|s| s == text) {
            Some(i) => i as i64,
            None => {
                table.push(text.to_owned());
                table.len() as i64 - 1
            }
        }
    };
    let keys = BOUND_LABELS.map(|key| intern(&mut message.string_table, key));
    let bytes = intern(&mut message.string_table, "bytes");
    let note = format!(
        "bounds: each sample's labels {} hold its bytes' bounds at {:.0}% confidence \
         (upper {} when nothing bounds it)",
        BOUND_LABELS.join(", "),
        profile.sampling.confidence * 100.0,
        i64::MAX
    );
    let note = intern(&mut message.string_table, &note);
    message.comment.push(note);
    // The export writes one sample per stack (no thread split in a period's profile), in
    // the profile's order.
    debug_assert_eq!(message.sample.len(), profile.stacks.len());
    for (sample, stack) in message.sample.iter_mut().zip(&profile.stacks) {
        let mut bounds = vec![stack.alloc_bytes.lower, stack.alloc_bytes.upper];
        if let Some(inuse) = stack.inuse_bytes {
            bounds.extend([inuse.lower, inuse.upper]);
        }
        for (key, bound) in keys.iter().zip(bounds) {
            sample.label.push(proto::Label {
                key: *key,
                num: whole(bound),
                num_unit: bytes,
                ..Default::default()
            });
        }
    }
    message
}

/// A bound as pprof's integer: rounded, an unbounded upper end as `i64::MAX`.
fn whole(bound: f64) -> i64 {
    if bound.is_finite() {
        bound.round() as i64
    } else {
        i64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{agent::period::split, stats::Estimate};
    use allocscope_model::fixtures::synthetic;

    fn label_num(message: &proto::Profile, sample: &proto::Sample, key: &str) -> Option<i64> {
        sample
            .label
            .iter()
            .find(|l| message.string_table[l.key as usize] == key)
            .map(|l| l.num)
    }

    #[test]
    fn each_sample_carries_its_stacks_bounds() {
        let mut profile = synthetic();
        profile.alloc_only = false;
        profile.stacks[0].inuse_bytes = Some(Estimate {
            samples: 2,
            estimate: 100.0,
            lower: 40.0,
            upper: f64::INFINITY,
        });
        let periods = split(&profile, 2.5);
        let message = bounded(&periods[0], 1_700_000_000_000_000_000);
        assert_eq!(message.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(message.duration_nanos, 2_500_000_000);
        assert_eq!(message.sample.len(), periods[0].profile.stacks.len());
        for (sample, stack) in message.sample.iter().zip(&periods[0].profile.stacks) {
            assert_eq!(
                label_num(&message, sample, "alloc_space_lower"),
                Some(stack.alloc_bytes.lower.round() as i64)
            );
            assert_eq!(
                label_num(&message, sample, "alloc_space_upper"),
                Some(stack.alloc_bytes.upper.round() as i64)
            );
        }
        let first = &message.sample[0];
        assert_eq!(label_num(&message, first, "inuse_space_lower"), Some(40));
        assert_eq!(
            label_num(&message, first, "inuse_space_upper"),
            Some(i64::MAX)
        );
        assert_eq!(
            label_num(&message, &message.sample[1], "inuse_space_lower"),
            None
        );
        let unit = message.sample[0].label.last().unwrap().num_unit;
        assert_eq!(message.string_table[unit as usize], "bytes");
        assert!(message
            .comment
            .iter()
            .any(|c| message.string_table[*c as usize].contains("95% confidence")));
    }
}
