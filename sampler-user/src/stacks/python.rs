//! Python frames in interned stacks: the functions they name, interned, and the merge of
//! a sample's Python frames into its native ones ([`crate::python::merge`]).

use std::collections::HashMap;

use super::{Frame, StackTable};
use crate::python::{Merge, PyFunction, PythonStack};

/// Interned Python functions (qualified name, file).
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
        let id = self.functions.len() as u32;
        self.functions.push(function.clone());
        self.index.insert(function.clone(), id);
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
