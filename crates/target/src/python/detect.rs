//! Finding CPython in a process: the file (the `python3.X` executable or `libpython3.X`)
//! that exports `_PyRuntime` and `Py_Version`, its version and layout, read from the file
//! itself (so it works before the interpreter has started), and the process addresses of
//! `_PyRuntime` and `PyCode_Type` from the mapping's load bias.

use std::ops::Range;

use object::{Object as _, ObjectSymbol as _};

use super::layout::{self, Layout};
use crate::sys::maps::{self, Vma};

/// An interpreter file, analysed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// Version and offsets.
    pub layout: Layout,
    /// Link-time addresses of `_PyRuntime` and `PyCode_Type`.
    runtime: u64,
    code_type: u64,
    /// File offsets of `_PyEval_EvalFrameDefault`: the native frames Python frames replace.
    pub eval: Range<u64>,
    segments: Vec<(Range<u64>, u64)>,
}

/// Whether a mapped file may be an interpreter, by its name: `python3.X` (or `python3`)
/// and `libpython3.X.so…`. Only such files are parsed (a host-wide recording sees every
/// process's first sample).
pub fn may_be_interpreter(path: &std::path::Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.starts_with("python3") || name.starts_with("libpython3")
}

/// Analyses an ELF file; `Ok(None)` when it is no CPython, `Err(reason)` when it is one
/// allocscope cannot read frames of (said to the user once).
pub fn analyse(bytes: &[u8]) -> Result<Option<Interpreter>, String> {
    let Ok(elf) = object::File::parse(bytes) else {
        return Ok(None);
    };
    let symbol = |name: &str| {
        elf.dynamic_symbols()
            .chain(elf.symbols())
            .find(|s| s.name() == Ok(name))
            .map(|s| (s.address(), s.size()))
    };
    let Some((runtime, _)) = symbol("_PyRuntime") else {
        return Ok(None);
    };
    let segments = maps::loadable_segments(&elf);
    let read = |address: u64, length: usize| -> Option<&[u8]> {
        let offset = file_offset(&segments, address)? as usize;
        bytes.get(offset..offset + length)
    };
    let Some((version_at, _)) = symbol("Py_Version") else {
        return Err("CPython before 3.11 (no Py_Version): native frames only".into());
    };
    let version = read(version_at, 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or("Py_Version unreadable")?;
    let (major, minor) = ((version >> 24) as u8, (version >> 16) as u8);
    let layout = match layout::for_version(major, minor) {
        Some(layout) => layout,
        None => read(runtime, 72 * 8)
            .and_then(layout::from_debug_offsets)
            .ok_or_else(|| {
                format!("CPython {major}.{minor}: frame layout unknown, native frames only")
            })?,
    };
    let (code_type, _) = symbol("PyCode_Type").ok_or("no PyCode_Type symbol")?;
    let (eval_at, eval_size) =
        symbol("_PyEval_EvalFrameDefault").ok_or("no _PyEval_EvalFrameDefault symbol")?;
    let eval_start = file_offset(&segments, eval_at).ok_or("_PyEval_EvalFrameDefault unmapped")?;
    Ok(Some(Interpreter {
        layout,
        runtime,
        code_type,
        eval: eval_start..eval_start + eval_size.max(1),
        segments,
    }))
}

/// The file offset of link-time address `address`.
fn file_offset(segments: &[(Range<u64>, u64)], address: u64) -> Option<u64> {
    segments.iter().find_map(|(file, start)| {
        let size = file.end - file.start;
        (address >= *start && address < start + size).then(|| file.start + (address - start))
    })
}

/// Where an interpreter is in one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Process address of `_PyRuntime.interpreters.head`.
    pub interpreters_head: u64,
    /// Process address of `PyCode_Type`.
    pub code_type: u64,
}

impl Interpreter {
    /// Its addresses in a process that maps it as `vmas` (those of its file).
    pub fn place(&self, vmas: &[&Vma]) -> Option<Placed> {
        let bias = vmas
            .iter()
            .find_map(|v| maps::load_bias(&self.segments, v.start, v.offset))?;
        Some(Placed {
            interpreters_head: bias
                .wrapping_add(self.runtime)
                .wrapping_add(self.layout.interpreters_head),
            code_type: bias.wrapping_add(self.code_type),
        })
    }
}

/// Whether process `pid` maps a file that may be an interpreter (by its name).
pub fn maps_interpreter(pid: u32) -> bool {
    maps::read(pid).is_ok_and(|vmas| {
        vmas.iter()
            .any(|v| v.path.as_deref().is_some_and(may_be_interpreter))
    })
}

/// Whether a command starts CPython: a word among its first four (split at blanks, for
/// `sh -c "python3 app.py"`) names `python…`, or names a script whose `#!` line does
/// (`shebang`: a word's `#!` line, if it is such a file).
pub fn command_may_be_python(
    command: &[std::ffi::OsString],
    shebang: impl Fn(&str) -> Option<String>,
) -> bool {
    let names_python = |text: &str| {
        text.split(|c: char| c.is_whitespace() || c == '/')
            .any(|part| part.starts_with("python"))
    };
    command
        .iter()
        .take(4)
        .flat_map(|word| {
            word.to_string_lossy()
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .any(|word| names_python(&word) || shebang(&word).is_some_and(|line| names_python(&line)))
}

/// The `#!` line of a regular file, if it starts with one.
pub fn shebang_of(path: &std::path::Path) -> Option<String> {
    use std::io::Read as _;
    let mut head = [0u8; 256];
    let read = crate::infile::open_regular(path)
        .ok()?
        .read(&mut head)
        .ok()?;
    let head = &head[..read];
    let line = head.strip_prefix(b"#!")?.split(|&b| b == b'\n').next()?;
    Some(String::from_utf8_lossy(line).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interpreters this machine has (Debian's, pyenv's): each found, with the version
    /// its own `sys.version_info` states.
    #[test]
    fn real_interpreters_are_recognised() {
        let mut found = 0;
        for (file, version) in [
            ("/usr/bin/python3.11", (3, 11)),
            (
                "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0",
                (3, 12),
            ),
            (
                "/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0",
                (3, 13),
            ),
        ] {
            let Ok(bytes) = std::fs::read(file) else {
                continue;
            };
            let interpreter = analyse(&bytes).unwrap().unwrap();
            assert_eq!(interpreter.layout.version, version, "{file}");
            assert!(
                interpreter.eval.end - interpreter.eval.start > 1000,
                "{file}"
            );
            found += 1;
        }
        assert!(
            found >= 1,
            "Debian's python3.11 is installed by cargo xtask setup"
        );
        let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        assert_eq!(analyse(&libc), Ok(None));
    }

    #[test]
    fn commands_that_start_python() {
        let command =
            |words: &[&str]| -> Vec<std::ffi::OsString> { words.iter().map(Into::into).collect() };
        let scripts = |word: &str| match word {
            "./serve" => Some("/usr/bin/env python3".to_owned()),
            "./build.sh" => Some("/bin/sh".to_owned()),
            _ => None,
        };
        for yes in [
            &["python3", "app.py"][..],
            &["/root/.pyenv/versions/3.12.1/bin/python3.12", "-c", "1"],
            &["env", "PYTHONPATH=x", "python3"],
            &["sh", "-c", "/usr/bin/python3 app.py; true"],
            &["./serve", "--port", "80"],
        ] {
            assert!(command_may_be_python(&command(yes), scripts), "{yes:?}");
        }
        for no in [
            &["sqlite3", "db"][..],
            &["perl", "x.pl"],
            &["./build.sh"],
            &[],
        ] {
            assert!(!command_may_be_python(&command(no), scripts), "{no:?}");
        }
    }

    #[test]
    fn interpreter_names() {
        use std::path::Path;
        assert!(may_be_interpreter(Path::new("/usr/bin/python3.11")));
        assert!(may_be_interpreter(Path::new("/x/libpython3.12.so.1.0")));
        assert!(!may_be_interpreter(Path::new("/usr/lib/libc.so.6")));
    }
}
