//! Python frames into a native stack: each `_PyEval_EvalFrameDefault` frame is replaced by
//! the Python frames that C call was running (CPython 3.11+ runs several in one C frame;
//! the entry markers say where one C call's frames end). Between Python frames the
//! interpreter's own call machinery (`_PyFunction_Vectorcall`, `_PyEval_Vector`, …) says
//! nothing a Python reader needs and is left out unless every native frame is asked for;
//! frames of other modules (C extensions) stay where they are.

use super::layout::OWNED_BY_CSTACK;

/// Splits a sample's Python frames (leaf first, each with its entry-marker byte) into the
/// groups that one C call of the evaluator ran, leaf first. `is_entry_flag`: 3.11's
/// `is_entry` (a marked frame is its group's last), else 3.12+'s `owner` (a frame owned by
/// the C stack is a shim between groups, not a Python frame).
pub(crate) fn groups<F: Clone>(frames: &[(F, u8)], is_entry_flag: bool) -> Vec<Vec<F>> {
    let mut groups = Vec::new();
    let mut current = Vec::new();
    for (frame, marker) in frames {
        if is_entry_flag {
            current.push(frame.clone());
            if *marker != 0 {
                groups.push(std::mem::take(&mut current));
            }
        } else if *marker == OWNED_BY_CSTACK {
            if !current.is_empty() {
                groups.push(std::mem::take(&mut current));
            }
        } else {
            current.push(frame.clone());
        }
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

/// Merges `groups` (leaf first) into `native` (leaf first): the n-th evaluator frame
/// (`is_eval`) becomes the n-th group. Between the first and the last Python frame, native
/// frames that `is_machinery` are dropped (how the interpreter calls a Python function);
/// those leafward of them (what the interpreter did: `bytearray___init___impl`) and
/// rootward (how it was entered: `Py_BytesMain`) stay. Groups left over (the native stack
/// was cut short, or an evaluator frame was not recognised) go at the root end, so no
/// Python frame is lost.
pub(crate) fn merge<F: Clone>(
    native: &[F],
    groups: Vec<Vec<F>>,
    is_eval: impl Fn(&F) -> bool,
    is_machinery: impl Fn(&F) -> bool,
) -> Vec<F> {
    let mut groups = groups.into_iter().peekable();
    // (frame, whether it is a Python frame)
    let mut merged: Vec<(F, bool)> = Vec::with_capacity(native.len());
    for frame in native {
        match groups.next_if(|_| is_eval(frame)) {
            Some(group) => merged.extend(group.into_iter().map(|f| (f, true))),
            None => merged.push((frame.clone(), false)),
        }
    }
    merged.extend(groups.flatten().map(|f| (f, true)));
    let first = merged.iter().position(|(_, python)| *python);
    let last = merged.iter().rposition(|(_, python)| *python);
    merged
        .into_iter()
        .enumerate()
        .filter(|(at, (frame, python))| {
            let between = first.is_some_and(|f| *at > f) && last.is_some_and(|l| *at < l);
            *python || !between || !is_machinery(frame)
        })
        .map(|(_, (frame, _))| frame)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_flags_end_groups_in_3_11() {
        let frames = [("f", 0), ("g", 1), ("h", 0), ("<module>", 1)];
        assert_eq!(
            groups(&frames, true),
            vec![vec!["f", "g"], vec!["h", "<module>"]]
        );
    }

    #[test]
    fn shims_separate_groups_from_3_12() {
        let frames = [
            ("f", 0),
            ("g", 0),
            ("shim", 3),
            ("<module>", 0),
            ("shim", 3),
        ];
        assert_eq!(
            groups(&frames, false),
            vec![vec!["f", "g"], vec!["<module>"]]
        );
    }

    #[test]
    fn evaluator_frames_become_python_frames() {
        // A C extension (json) between two evaluator calls, machinery around them.
        let native = [
            "PyByteArray_Resize",
            "_PyEval_EvalFrameDefault",
            "_PyFunction_Vectorcall",
            "encoder_call",
            "_PyEval_EvalFrameDefault",
            "PyEval_EvalCode",
            "Py_BytesMain",
        ];
        let groups = vec![vec!["py:f", "py:g"], vec!["py:<module>"]];
        let machinery = |f: &&str| !matches!(*f, "encoder_call" | "__libc_start_main");
        let merged = merge(
            &native,
            groups.clone(),
            |f| *f == "_PyEval_EvalFrameDefault",
            machinery,
        );
        assert_eq!(
            merged,
            [
                "PyByteArray_Resize",
                "py:f",
                "py:g",
                "encoder_call",
                "py:<module>",
                "PyEval_EvalCode",
                "Py_BytesMain"
            ]
        );
        let all = merge(
            &native,
            groups,
            |f| *f == "_PyEval_EvalFrameDefault",
            |_| false,
        );
        assert_eq!(all.len(), native.len() - 2 + 3);
    }

    #[test]
    fn no_python_frame_is_lost() {
        let native = ["malloc_site", "_PyEval_EvalFrameDefault"];
        let merged = merge(
            &native,
            vec![vec!["py:a"], vec!["py:b"]],
            |f| *f == "_PyEval_EvalFrameDefault",
            |_| true,
        );
        assert_eq!(merged, ["malloc_site", "py:a", "py:b"]);
        // No groups: native stays.
        assert_eq!(merge(&native, vec![], |_| true, |_| true), native);
    }
}
