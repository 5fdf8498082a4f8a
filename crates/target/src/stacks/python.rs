//! Python frames in interned stacks: the functions they name, interned, and the merge of
//! a sample's Python frames into its native ones ([`crate::python::merge`]).

use std::collections::HashMap;

use super::{Frame, StackTable};
use crate::python::{Merge, PyFunction, PythonStack};

/// Most distinct Python functions kept: a program that makes functions without end
/// (`exec` of generated code, templates compiled per request) would otherwise grow the
/// table for as long as it is recorded. Past it, new functions share one marked frame.
const MAX_FUNCTIONS: usize = 1 << 16;

/// Interned Python functions (qualified name, file), at most [`MAX_FUNCTIONS`].
#[derive(Debug, Default)]
pub struct PythonFunctions {
    functions: Vec<PyFunction>,
    index: HashMap<PyFunction, u32>,
}

impl PythonFunctions {
    fn intern(&mut self, function: &PyFunction) -> u32 {
        if let Some(&id) = self.index.get(function) {
            return id;
        }
        if self.functions.len() >= MAX_FUNCTIONS {
            let beyond = PyFunction {
                qualname: "[python functions beyond the first 65536]".into(),
                filename: "".into(),
            };
            return match self.index.get(&beyond) {
                Some(&id) => id,
                None => self.insert(beyond),
            };
        }
        self.insert(function.clone())
    }

    fn insert(&mut self, function: PyFunction) -> u32 {
        let id = self.functions.len() as u32;
        self.functions.push(function.clone());
        self.index.insert(function, id);
        id
    }

    /// Function `id`.
    pub fn get(&self, id: u32) -> Option<&PyFunction> {
        self.functions.get(id as usize)
    }
}

impl StackTable {
    /// `native` with `python`'s frames in place of its evaluator frames.
    pub(super) fn with_python(&mut self, native: &[Frame], python: &PythonStack) -> Vec<Frame> {
        let groups = python
            .groups
            .iter()
            .map(|group| {
                group
                    .iter()
                    .map(|frame| Frame::Python {
                        function: self.python.intern(&frame.function),
                        line: frame.line,
                    })
                    .collect()
            })
            .collect();
        let interpreter = |frame: &Frame| match *frame {
            Frame::File { module, offset } => self
                .modules
                .file_ids
                .get(module as usize)
                .filter(|id| **id == python.interpreter)
                .map(|_| offset),
            _ => None,
        };
        let keep_all = self.python_merge == Some(Merge::All);
        crate::python::merge::merge(
            native,
            groups,
            |frame| interpreter(frame).is_some_and(|offset| python.eval.contains(&offset)),
            |frame| !keep_all && interpreter(frame).is_some(),
        )
    }

    /// How Python frames are merged from now on.
    pub fn merge_python(&mut self, merge: Merge) {
        self.python_merge = Some(merge);
    }

    /// The Python functions frames name.
    pub fn python_functions(&self) -> &PythonFunctions {
        &self.python
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_function_table_is_bounded() {
        let mut table = PythonFunctions::default();
        let function = |i: usize| PyFunction {
            qualname: format!("f{i}").into(),
            filename: "gen.py".into(),
        };
        let first = table.intern(&function(0));
        assert_eq!(table.intern(&function(0)), first);
        for i in 1..MAX_FUNCTIONS + 10 {
            table.intern(&function(i));
        }
        assert_eq!(table.functions.len(), MAX_FUNCTIONS + 1);
        let beyond = table.intern(&function(MAX_FUNCTIONS + 20));
        assert!(table.get(beyond).unwrap().qualname.contains("beyond"));
        assert_eq!(table.intern(&function(5)), 5, "known ones keep their ids");
    }
}
