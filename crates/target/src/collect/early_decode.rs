//! The in-process front end's early records ([`sampler_common::preload::EarlyRecord`]):
//! the samples and frees a command's library kept while allocscope attached, turned into
//! the events the ring buffer would have carried. Pure: the caller reads the records from
//! the family table and puts the still-live blocks into the kernel's live map.

use sampler_common::{
    preload::{ALLOC_UNTRACKED, EARLY_ALLOC, EARLY_FREE},
    AllocFn,
};

use super::{CopiedStack, Event, Freed, Sample};
pub(crate) use crate::preload::EarlyCopy;
use crate::python::PythonStack;

/// What the early records say: the events in the order they were written, and the
/// tracked blocks still live at the end (pid, address, time of the sample) for the
/// kernel's live map, so that their frees from now on are seen. `track_frees`: the
/// recording tracks frees (else no block is tracked and frees are dropped).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Early {
    /// Samples and frees, in the order the records were claimed.
    pub events: Vec<Event>,
    /// Blocks sampled and not freed in the records.
    pub live: Vec<(u32, u64, u64)>,
    /// Records that were malformed (a function out of range, a size of 0) and left out.
    pub malformed: u64,
}

/// Turns `records` (in claim order) into events and the blocks left live; `python` gives
/// a sample's Python frames, resolved (called with the record's index for those whose
/// library read frames).
pub fn events(
    records: Vec<EarlyCopy>,
    track_frees: bool,
    mut python: impl FnMut(usize, &EarlyCopy) -> Option<PythonStack>,
) -> Early {
    let mut early = Early::default();
    let mut live: Vec<(u32, u64, u64)> = Vec::new();
    for (index, record) in records.into_iter().enumerate() {
        match record.head.kind {
            EARLY_ALLOC => match sample(&record, track_frees) {
                Some(mut sample) => {
                    if sample.python_sent {
                        sample.python = python(index, &record).map(Box::new);
                    }
                    if sample.tracked {
                        live.retain(|&(p, a, _)| (p, a) != (sample.pid, sample.address));
                        live.push((sample.pid, sample.address, sample.timestamp_ns));
                    }
                    early.events.push(Event::Alloc(sample));
                }
                None => early.malformed += 1,
            },
            EARLY_FREE if track_frees => {
                let before = live.len();
                let (pid, address) = (record.pid(), record.head.address);
                live.retain(|&(p, a, _)| (p, a) != (pid, address));
                // Only the free of a block seen sampled here: as the kernel's live map
                // would, nothing for another.
                if live.len() < before {
                    early.events.push(Event::Free(Freed {
                        pid,
                        timestamp_ns: record.head.timestamp_ns,
                        address,
                        read: false,
                    }));
                }
            }
            EARLY_FREE => {}
            _ => early.malformed += 1,
        }
    }
    early.live = live;
    early
}

fn sample(copy: &EarlyCopy, track_frees: bool) -> Option<Sample> {
    let record = &copy.head;
    let function = AllocFn::from_u32((record.how & 0xff) as u32)?;
    if record.size == 0 || record.offset >= record.size || record.interval == 0 {
        return None;
    }
    let tracked = track_frees && record.address != 0 && record.how & ALLOC_UNTRACKED == 0;
    Some(Sample {
        pid: record.pid as u32,
        tid: record.tid as u32,
        thread_comm: record.comm,
        timestamp_ns: record.timestamp_ns,
        function,
        size: record.size,
        offset: record.offset,
        interval: record.interval,
        return_address: 0,
        stack: Vec::new(),
        stack_at_return: false,
        copied: Some(CopiedStack {
            ip: record.ip,
            sp: record.sp,
            bp: record.bp,
            start: record.sp,
            bytes: copy.stack.clone(),
            returns: Vec::new(),
        }),
        address: if track_frees { record.address } else { 0 },
        tracked,
        weight: None,
        python_sent: record.py_head != 0,
        python: None,
        runtime_traceback: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sampler_common::preload::EarlyHead;

    fn alloc(pid: u32, address: u64, at: u64) -> EarlyCopy {
        EarlyCopy {
            head: EarlyHead {
                kind: EARLY_ALLOC,
                pid: pid.into(),
                tid: pid.into(),
                timestamp_ns: at,
                address,
                size: 100,
                offset: 7,
                interval: 4096,
                how: AllocFn::Malloc as u64,
                ip: 0x1000,
                sp: 0x7ff0,
                ..EarlyHead::default()
            },
            stack: vec![1, 2, 3],
            ..EarlyCopy::default()
        }
    }

    fn free(pid: u32, address: u64, at: u64) -> EarlyCopy {
        EarlyCopy {
            head: EarlyHead {
                kind: EARLY_FREE,
                pid: pid.into(),
                timestamp_ns: at,
                address,
                ..EarlyHead::default()
            },
            ..EarlyCopy::default()
        }
    }

    fn no_python(_: usize, _: &EarlyCopy) -> Option<PythonStack> {
        None
    }

    #[test]
    fn python_frames_are_asked_for_the_samples_that_carry_them() {
        let mut python = alloc(1, 0xb0, 2);
        python.head.py_head = 0x7f00_0000_0028;
        python.python = vec![sampler_common::python::PyFrameEntry::default()];
        let stack = PythonStack {
            groups: Vec::new(),
            interpreter: crate::sys::maps::FileId {
                device: "fe:01".into(),
                inode: 7,
            },
            eval: 0..1,
        };
        let mut asked = Vec::new();
        let early = events(
            vec![alloc(1, 0xa0, 1), python, free(1, 0xa0, 3)],
            true,
            |index, record| {
                asked.push((index, record.python.len()));
                Some(stack.clone())
            },
        );
        assert_eq!(asked, [(1, 1)]);
        let samples: Vec<&Sample> = early
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Alloc(sample) => Some(sample),
                _ => None,
            })
            .collect();
        assert!(!samples[0].python_sent && samples[0].python.is_none());
        assert!(samples[1].python_sent);
        assert_eq!(samples[1].python.as_deref(), Some(&stack));
    }

    #[test]
    fn blocks_freed_in_the_records_are_not_left_live() {
        let early = events(
            vec![
                alloc(1, 0xa0, 1),
                alloc(1, 0xb0, 2),
                free(1, 0xa0, 3),
                alloc(2, 0xa0, 4),
                free(2, 0xc0, 5), // never sampled here: no event
            ],
            true,
            no_python,
        );
        assert_eq!(early.live, vec![(1, 0xb0, 2), (2, 0xa0, 4)]);
        let kinds: Vec<&str> = early
            .events
            .iter()
            .map(|e| match e {
                Event::Alloc(_) => "alloc",
                Event::Free(_) => "free",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["alloc", "alloc", "free", "alloc"]);
        let Event::Alloc(first) = &early.events[0] else {
            panic!("not a sample")
        };
        let copied = first.copied.as_ref().unwrap();
        assert_eq!(
            (copied.ip, copied.sp, copied.start),
            (0x1000, 0x7ff0, 0x7ff0)
        );
        assert_eq!(copied.bytes, [1, 2, 3]);
        assert!(first.tracked);
    }

    #[test]
    fn without_frees_tracked_nothing_is_live_and_frees_are_dropped() {
        let early = events(vec![alloc(1, 0xa0, 1), free(1, 0xa0, 2)], false, no_python);
        assert!(early.live.is_empty());
        assert_eq!(early.events.len(), 1);
        let Event::Alloc(sample) = &early.events[0] else {
            panic!("not a sample")
        };
        assert!(!sample.tracked);
        assert_eq!(sample.address, 0);
    }

    #[test]
    fn untracked_and_malformed_records() {
        let mut untracked = alloc(1, 0xa0, 1);
        untracked.head.how |= ALLOC_UNTRACKED;
        let mut empty = alloc(1, 0xb0, 2);
        empty.head.size = 0;
        let mut unknown = alloc(1, 0xc0, 3);
        unknown.head.kind = 9;
        let early = events(vec![untracked, empty, unknown], true, no_python);
        assert_eq!(early.malformed, 2);
        assert!(early.live.is_empty());
        let Event::Alloc(sample) = &early.events[0] else {
            panic!("not a sample")
        };
        assert!(!sample.tracked);
    }
}
