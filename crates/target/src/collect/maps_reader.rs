//! The maps of a process read on the intake thread, at its first sample: a process that
//! lives a few milliseconds may be gone by the time its samples are unwound, and its
//! mappings with it.

use super::{monotonic_ns, Event};

/// Reads a process's maps on the intake thread, at its first sample since its exec (the
/// sample comes from its allocator, so its libraries are mapped by then), and sends them
/// ahead of the sample: see [`Event::Maps`].
#[derive(Default)]
pub(super) struct MapsReader {
    /// Processes whose maps were sent since their last exec.
    pub sent: std::collections::HashSet<u32>,
    /// Python frames (unless `--python-frames off`): told of every maps read.
    pub python: Option<crate::python::Frames>,
}

impl MapsReader {
    /// Most processes remembered; beyond, the set starts over (a few maps read again).
    const MAX_REMEMBERED: usize = 1 << 16;

    /// Forgets the processes in `gone` (and their Python frames' state).
    pub(super) fn forget(&mut self, gone: &std::collections::BTreeSet<u32>) {
        if gone.is_empty() {
            return;
        }
        self.sent.retain(|pid| !gone.contains(pid));
        if let Some(python) = &mut self.python {
            python.forget(gone);
        }
    }

    pub(super) fn before(&mut self, event: &Event, out: &mut Vec<Event>) {
        match *event {
            Event::Alloc(ref sample) => {
                if self.sent.len() >= Self::MAX_REMEMBERED {
                    self.sent.clear();
                }
                if self.sent.insert(sample.pid) {
                    let read_ns = monotonic_ns();
                    if let Ok((text, exiting)) = crate::sys::maps::read_text_until_exit(sample.pid)
                    {
                        // A read the exit overtook may be short: sent as read at 0, a
                        // stand-in that any other copy replaces (its library's own, read at
                        // its sample; as newer, it had replaced that one, and a shell loop's
                        // quick processes' frames ended in no file).
                        let read_ns = if exiting { 0 } else { read_ns };
                        if let Some(python) = &mut self.python {
                            python.found_maps(sample.pid, &crate::sys::maps::parse(&text));
                        }
                        out.push(Event::Maps {
                            pid: sample.pid,
                            read_ns,
                            text,
                        });
                    }
                }
            }
            Event::Process { pid, parent: 0, .. } => {
                self.sent.remove(&pid);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gone_processes_are_forgotten_and_the_others_kept() {
        let mut reader = MapsReader {
            sent: [1, 2, 3].into_iter().collect(),
            python: Some(crate::python::Frames::new(None)),
        };
        reader.forget(&[2, 9].into_iter().collect());
        let mut left: Vec<u32> = reader.sent.iter().copied().collect();
        left.sort_unstable();
        assert_eq!(left, [1, 3]);
    }
}
