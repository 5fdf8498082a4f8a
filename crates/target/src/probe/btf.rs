//! The one kernel structure offset the eBPF programs need, read from the kernel's BTF.
//!
//! Why: a new process is followed from `task_newtask`, which runs in the parent and names
//! the child by its `task_struct`. As a perf-event tracepoint the kernel hands over the
//! child's pid in the event's record, but closing such a link waits for the tracepoint
//! grace periods (docs/performance.md, "Figures quoted from the code"): a third of a short
//! command's recording. As a raw tracepoint it closes at once, and the child's pid must be
//! read from the `task_struct`, whose layout differs per kernel build:
//! `/sys/kernel/btf/vmlinux` says where `pid` is. Without BTF the perf-event tracepoint is
//! used.
//!
//! A minimal reader: the type section is walked once for one struct's one member (the
//! format: linux/Documentation/bpf/btf.rst).

use std::borrow::Cow;

const MAGIC: u16 = 0xeb9f;

// Kinds (btf.rst, "BTF kind encoding").
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// Byte offset of `pid` in the running kernel's `struct task_struct`, if its BTF says.
pub(crate) fn task_pid_offset() -> Option<u32> {
    let data = std::fs::read("/sys/kernel/btf/vmlinux").ok()?;
    member_offset(&data, "task_struct", "pid")
}

/// Byte offset of member `member` of struct `name` in the BTF blob `data` (the first struct
/// of that name with such a member; a bit-field member or a malformed blob: `None`).
pub(crate) fn member_offset(data: &[u8], name: &str, member: &str) -> Option<u32> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?));
    if u16_at(0)? != MAGIC {
        return None;
    }
    let header_len = u32_at(4)? as usize;
    let types = header_len.checked_add(u32_at(8)? as usize)?;
    let types_end = types.checked_add(u32_at(12)? as usize)?;
    let strings = header_len.checked_add(u32_at(16)? as usize)?;
    let strings_end = strings.checked_add(u32_at(20)? as usize)?;
    let string = |offset: u32| -> Option<Cow<'_, str>> {
        let start = strings.checked_add(offset as usize)?;
        let bytes = data.get(start..strings_end)?;
        let end = bytes.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&bytes[..end]))
    };
    let mut at = types;
    while at < types_end {
        let info = u32_at(at + 4)?;
        let (kind, vlen, kind_flag) = ((info >> 24) & 0x1f, (info & 0xffff) as usize, info >> 31);
        let body = at + 12;
        let extra = match kind {
            KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
            KIND_ARRAY => 12,
            KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
            KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
            _ => 0,
        };
        if kind == KIND_STRUCT && string(u32_at(at)?).as_deref() == Some(name) {
            for index in 0..vlen {
                let entry = body + 12 * index;
                if string(u32_at(entry)?).as_deref() != Some(member) {
                    continue;
                }
                let offset = u32_at(entry + 8)?;
                // With the kind flag, the high byte is a bit-field size: refused.
                let (bits, field) = if kind_flag != 0 {
                    (offset & 0x00ff_ffff, offset >> 24)
                } else {
                    (offset, 0)
                };
                return (field == 0 && bits % 8 == 0).then_some(bits / 8);
            }
        }
        at = body.checked_add(extra)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob with `struct task_struct { int state; int pid; }` after an `int`.
    fn blob(kind_flag: bool, pid_bits: u32) -> Vec<u8> {
        let strings = b"\0int\0task_struct\0state\0pid\0";
        let mut types = Vec::new();
        let word = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
        // [1] int: name "int", kind INT, size 4, then its encoding word.
        word(&mut types, 1);
        word(&mut types, KIND_INT << 24);
        word(&mut types, 4);
        word(&mut types, 32);
        // [2] struct task_struct, two members.
        word(&mut types, 5);
        word(
            &mut types,
            (KIND_STRUCT << 24) | 2 | (u32::from(kind_flag) << 31),
        );
        word(&mut types, 8);
        for (name, bits) in [(17u32, 0u32), (23, pid_bits)] {
            word(&mut types, name);
            word(&mut types, 1);
            word(&mut types, bits);
        }
        let mut data = Vec::new();
        data.extend_from_slice(&MAGIC.to_le_bytes());
        data.extend_from_slice(&[1, 0]);
        word(&mut data, 24);
        word(&mut data, 0);
        word(&mut data, types.len() as u32);
        word(&mut data, types.len() as u32);
        word(&mut data, strings.len() as u32);
        data.extend_from_slice(&types);
        data.extend_from_slice(strings);
        data
    }

    #[test]
    fn a_members_offset_is_found_in_bytes() {
        assert_eq!(
            member_offset(&blob(false, 32), "task_struct", "pid"),
            Some(4)
        );
        assert_eq!(
            member_offset(&blob(false, 32), "task_struct", "state"),
            Some(0)
        );
        assert_eq!(member_offset(&blob(false, 32), "task_struct", "tgid"), None);
        assert_eq!(member_offset(&blob(false, 32), "mm_struct", "pid"), None);
        // Kind flag: the offset's low 24 bits, when not a bit-field.
        assert_eq!(
            member_offset(&blob(true, 64), "task_struct", "pid"),
            Some(8)
        );
        assert_eq!(
            member_offset(&blob(true, (3 << 24) | 64), "task_struct", "pid"),
            None
        );
    }

    #[test]
    fn malformed_blobs_are_refused_without_panicking() {
        let whole = blob(false, 32);
        for cut in 0..whole.len() {
            let _ = member_offset(&whole[..cut], "task_struct", "pid");
        }
        let mut bad = whole.clone();
        bad[0] = 0;
        assert_eq!(member_offset(&bad, "task_struct", "pid"), None);
    }

    #[test]
    fn this_kernels_task_struct_has_a_pid() {
        // Every kernel allocscope runs on has BTF (the eBPF programs need it too); the
        // offset is somewhere inside the first few KiB of task_struct.
        let Some(offset) = task_pid_offset() else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "no BTF at /sys/kernel/btf/vmlinux"
            );
            eprintln!("SKIPPED: no kernel BTF here");
            return;
        };
        assert!(offset > 0 && offset < 16384, "{offset}");
    }
}
