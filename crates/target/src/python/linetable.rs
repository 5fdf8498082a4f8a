//! The line of an instruction, from a 3.11+ code object's location table (`co_linetable`,
//! CPython's Objects/locations.md): entries of one to eight code units, each with a line
//! delta from the previous entry's line (or none), starting at `co_firstlineno`.

/// The source line of code unit `index` (instruction offset in bytes / 2), or `None` when
/// the table says the instruction has no location or does not cover it.
pub(crate) fn line_of(table: &[u8], first_line: i64, index: u64) -> Option<u32> {
    let mut bytes = table.iter().copied();
    let mut line = first_line;
    let mut start = 0u64;
    while let Some(head) = bytes.next() {
        if head & 0x80 == 0 {
            return None;
        }
        let code = (head >> 3) & 15;
        let length = u64::from(head & 7) + 1;
        let delta = match code {
            15 => None,
            14 => {
                let delta = signed_varint(&mut bytes)?;
                for _ in 0..3 {
                    varint(&mut bytes)?;
                }
                Some(delta)
            }
            13 => Some(signed_varint(&mut bytes)?),
            10..=12 => {
                bytes.next()?;
                bytes.next()?;
                Some(i64::from(code) - 10)
            }
            _ => {
                bytes.next()?;
                Some(0)
            }
        };
        if let Some(delta) = delta {
            line += delta;
        }
        if index < start + length {
            return delta.and_then(|_| u32::try_from(line).ok());
        }
        start += length;
    }
    None
}

/// An unsigned varint: 6-bit groups, least significant first, bit 6 set while more follow.
fn varint(bytes: &mut impl Iterator<Item = u8>) -> Option<u64> {
    let mut byte = bytes.next()?;
    let mut value = u64::from(byte & 63);
    let mut shift = 6;
    while byte & 64 != 0 {
        byte = bytes.next()?;
        if shift > 60 {
            return None;
        }
        value |= u64::from(byte & 63) << shift;
        shift += 6;
    }
    Some(value)
}

/// A signed varint: the sign in the lowest bit.
fn signed_varint(bytes: &mut impl Iterator<Item = u8>) -> Option<i64> {
    let value = varint(bytes)?;
    let magnitude = (value >> 1) as i64;
    Some(if value & 1 != 0 {
        -magnitude
    } else {
        magnitude
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each function's `co_linetable`, `co_firstlineno` and `co_lines()`, as Debian's
    /// python3 prints them: the interpreter's own reading of its tables is the truth.
    const DUMP: &str = r#"
import json, sys
src = '''
def plain(a, b):
    c = a + b
    return c * 2

def branches(x):
    if x > 3:
        y = [i for i in range(x)]
    else:
        y = {}
    for k in range(3):
        try:
            y = y + [k]
        except TypeError:
            pass
    return y

''' + "\n" * 300 + '''
def far_away():
    return (1,
            2,
            3)
'''
ns = {}
exec(compile(src, "sample.py", "exec"), ns)
out = []
def codes(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_lines"):
            yield from codes(const)
for name in ("plain", "branches", "far_away"):
    for code in codes(ns[name].__code__):
        out.append([list(code.co_linetable), code.co_firstlineno,
                    [[s, e, l] for s, e, l in code.co_lines()]])
json.dump(out, sys.stdout)
"#;

    #[test]
    fn lines_are_the_interpreters_own() {
        let output = std::process::Command::new("/usr/bin/python3")
            .args(["-c", DUMP])
            .output()
            .expect("Debian's python3 (cargo xtask setup installs it)");
        assert!(output.status.success(), "{output:?}");
        type Lines = Vec<(u64, u64, Option<i64>)>;
        let codes: Vec<(Vec<u8>, i64, Lines)> = serde_json::from_slice(&output.stdout).unwrap();
        assert!(codes.len() >= 4);
        let mut checked = 0;
        for (table, first, lines) in codes {
            for (start, end, line) in lines {
                for offset in (start..end).step_by(2) {
                    let expected = line.map(|l| l as u32);
                    assert_eq!(line_of(&table, first, offset / 2), expected, "at {offset}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 50, "{checked}");
    }

    #[test]
    fn a_broken_table_says_nothing() {
        assert_eq!(line_of(&[], 1, 0), None);
        assert_eq!(line_of(&[0x01], 1, 0), None);
        // Long form cut short.
        assert_eq!(line_of(&[0x80 | (14 << 3)], 1, 0), None);
        // One-line form, delta 2, covering units 0..2.
        assert_eq!(line_of(&[0x80 | (12 << 3) | 1, 0, 0], 10, 1), Some(12));
        assert_eq!(line_of(&[0x80 | (12 << 3) | 1, 0, 0], 10, 2), None);
    }
}
