//! Unwinding a copied stack with the modules' CFI (`--unwind dwarf`), in user space.
//!
//! The kernel copies, for sampled calls only, the registers and the top of the user stack
//! ([`CopiedStack`]); here framehop walks it with the `.eh_frame` (or `.debug_frame`) of every
//! file the process maps, falling back to the frame-pointer rule where a module has no CFI.
//! One framehop unwinder per process holds its modules; it is rebuilt when the process's
//! maps were re-read (a library loaded). Which frames are believed is decided afterwards,
//! for every unwinding mode alike ([`super::call_site`]).

pub use crate::schema::StackEnd;

use std::{collections::HashMap, ops::Range, sync::Arc};

use framehop::{
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
    FrameAddress, Module, ModuleSectionInfo, Unwinder as _,
};

use super::image::{Image, SectionBytes};
use crate::collect::CopiedStack;

/// Most frames taken from one stack.
pub(crate) const MAX_FRAMES: usize = 512;

/// How far above the copy a failed read still means "the stack goes on beyond the window"
/// rather than a wild address (a stack is at most a few megabytes).
const STACK_BEYOND_WINDOW: u64 = 8 << 20;

/// One module to add to a process's unwinder: where it is mapped and its file.
pub(crate) struct Mapped {
    /// Address range of its executable mapping.
    pub range: Range<u64>,
    /// Load bias (the process address of the file's virtual address 0).
    pub bias: u64,
    /// The file.
    pub image: Arc<Image>,
    /// Shown in framehop's debugging output only.
    pub name: String,
}

/// framehop's view of an ELF image.
struct ElfSections(Arc<Image>);

impl ModuleSectionInfo<SectionBytes> for ElfSections {
    fn base_svma(&self) -> u64 {
        0
    }

    fn section_svma_range(&mut self, name: &[u8]) -> Option<Range<u64>> {
        Some(self.0.section(name)?.0)
    }

    fn section_data(&mut self, name: &[u8]) -> Option<SectionBytes> {
        Some(self.0.section(name)?.1)
    }
}

/// The unwinders of all processes and the rule cache they share.
#[derive(Default)]
pub(crate) struct Unwinders {
    processes: HashMap<u32, (u64, UnwinderX86_64<SectionBytes>)>,
    cache: CacheX86_64,
}

impl std::fmt::Debug for Unwinders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unwinders")
            .field("processes", &self.processes.len())
            .finish()
    }
}

impl Unwinders {
    /// Drops `pid`'s unwinder (it is gone).
    pub(crate) fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }

    /// Whether `pid`'s unwinder was built from generation `maps` of its maps.
    pub(crate) fn is_current(&self, pid: u32, maps: u64) -> bool {
        self.processes
            .get(&pid)
            .is_some_and(|(built, _)| *built == maps)
    }

    /// (Re)builds `pid`'s unwinder from its modules as of generation `maps` of its maps.
    pub(crate) fn rebuild(&mut self, pid: u32, maps: u64, modules: Vec<Mapped>) {
        let mut unwinder = UnwinderX86_64::new();
        for mapped in modules {
            unwinder.add_module(Module::new(
                mapped.name,
                mapped.range,
                mapped.bias,
                ElfSections(mapped.image),
            ));
        }
        self.processes.insert(pid, (maps, unwinder));
    }

    /// Walks `copied` of process `pid`: the return addresses, innermost first, and why the
    /// walk ended. At a return (`at_return`) the instruction pointer is the direct caller's
    /// return address and is the first frame; at an entry it is the allocator's own code
    /// and is left out. `trampoline` is where the process's uprobe area is.
    pub(crate) fn unwind(
        &mut self,
        pid: u32,
        copied: &CopiedStack,
        at_return: bool,
        trampoline: u64,
    ) -> (Vec<u64>, StackEnd) {
        let empty;
        let unwinder = match self.processes.get(&pid) {
            Some((_, unwinder)) => unwinder,
            None => {
                empty = UnwinderX86_64::new();
                &empty
            }
        };
        walk(unwinder, &mut self.cache, copied, at_return, trampoline)
    }
}

/// The word at stack address `slot`, `value`, or, when it is the kernel's uretprobe
/// trampoline (a return probe hijacked this return), the return address the slot held when
/// the probed function was entered (`returns`: slot and original, newest first). Pure.
pub(crate) fn original_return(
    value: u64,
    slot: u64,
    trampoline: u64,
    returns: &[(u64, u64)],
) -> u64 {
    if value.wrapping_sub(trampoline) >= TRAMPOLINE_AREA {
        return value;
    }
    returns
        .iter()
        .find(|(at, _)| *at == slot)
        .map_or(value, |&(_, original)| original)
}

/// Size of the kernel's uprobe area (its trampoline is in the first slot).
const TRAMPOLINE_AREA: u64 = 4096;

fn walk(
    unwinder: &UnwinderX86_64<SectionBytes>,
    cache: &mut CacheX86_64,
    copied: &CopiedStack,
    at_return: bool,
    trampoline: u64,
) -> (Vec<u64>, StackEnd) {
    let end_of_copy = copied.start + copied.bytes.len() as u64;
    let mut read_stack = |address: u64| -> Result<u64, ()> {
        let offset = address.checked_sub(copied.start).ok_or(())? as usize;
        let word = copied
            .bytes
            .get(offset..offset.checked_add(8).ok_or(())?)
            .ok_or(())?;
        let value = u64::from_le_bytes(word.try_into().map_err(|_| ())?);
        Ok(original_return(value, address, trampoline, &copied.returns))
    };
    let regs = UnwindRegsX86_64::new(copied.ip, copied.sp, copied.bp);
    let mut frames = unwinder.iter_frames(copied.ip, regs, cache, &mut read_stack);
    let mut addresses = Vec::new();
    loop {
        if addresses.len() >= MAX_FRAMES {
            return (addresses, StackEnd::Depth);
        }
        match frames.next() {
            Ok(Some(FrameAddress::InstructionPointer(ip))) => {
                if at_return {
                    addresses.push(ip);
                }
            }
            Ok(Some(FrameAddress::ReturnAddress(address))) => addresses.push(address.get()),
            Ok(None) => return (addresses, StackEnd::Root),
            Err(framehop::Error::CouldNotReadStack(address))
                if (end_of_copy..end_of_copy + STACK_BEYOND_WINDOW).contains(&address) =>
            {
                return (addresses, StackEnd::Window)
            }
            Err(_) => return (addresses, StackEnd::UnwindFailed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This very thread's registers and stack, as the kernel would copy them.
    #[inline(never)]
    fn copy_own_stack(window: usize) -> CopiedStack {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers; touches no memory.
        unsafe {
            std::arch::asm!(
                // rbp first: in code without frame pointers it may also serve as an output.
                "mov {bp}, rbp",
                "mov {sp}, rsp",
                "lea {ip}, [rip]",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
            );
        }
        // Like the kernel's copy, stop at the end of the stack's mapping: a test thread
        // runs near the top of its stack.
        let end = crate::sys::maps::read(std::process::id())
            .unwrap()
            .into_iter()
            .find(|vma| (vma.start..vma.end).contains(&sp))
            .expect("the stack is mapped")
            .end;
        let window = window.min((end - sp) as usize);
        // SAFETY: the `window` bytes above our stack pointer are this thread's live stack,
        // inside its mapping (just checked).
        let bytes = unsafe { std::slice::from_raw_parts(sp as *const u8, window) }.to_vec();
        CopiedStack {
            ip,
            sp,
            bp,
            start: sp,
            bytes,
            returns: Vec::new(),
        }
    }

    fn own_modules() -> Vec<Mapped> {
        crate::sys::maps::read(std::process::id())
            .unwrap()
            .into_iter()
            .filter(|vma| vma.executable && vma.path.is_some())
            .filter_map(|vma| {
                let file = std::fs::File::open(vma.path.as_ref()?).ok()?;
                let image = Image::open(&file)?;
                Some(Mapped {
                    range: vma.start..vma.end,
                    bias: image.bias(vma.start, vma.offset)?,
                    image,
                    name: vma.path?.display().to_string(),
                })
            })
            .collect()
    }

    #[inline(never)]
    fn level_two(window: usize) -> CopiedStack {
        std::hint::black_box(copy_own_stack(window))
    }

    #[inline(never)]
    fn level_one(window: usize) -> CopiedStack {
        std::hint::black_box(level_two(window))
    }

    #[test]
    fn a_copied_stack_unwinds_through_our_own_frames() {
        let copied = level_one(32 * 1024);
        let mut unwinders = Unwinders::default();
        unwinders.rebuild(1, 0, own_modules());
        let (frames, end) = unwinders.unwind(1, &copied, true, sampler_common::UPROBE_TRAMPOLINE);
        // ip is inside copy_own_stack; its callers follow, each a return address into the
        // function that called.
        let inside = |address: u64, function: usize| address.wrapping_sub(function as u64) < 4096;
        assert!(frames.len() > 3, "{frames:x?} {end:?}");
        assert!(
            inside(frames[1], level_two as *const () as usize),
            "{frames:x?}"
        );
        assert!(
            inside(frames[2], level_one as *const () as usize),
            "{frames:x?}"
        );
        assert!(
            matches!(end, StackEnd::Window | StackEnd::Root),
            "{end:?} after {} frames",
            frames.len()
        );
    }

    #[test]
    fn trampolines_in_return_slots_are_put_back() {
        let trampoline = sampler_common::UPROBE_TRAMPOLINE;
        let returns = [(0x7000, 0x401234), (0x7100, 0x405678), (0x7000, 0x409999)];
        // The newest entry of a slot wins.
        assert_eq!(
            original_return(trampoline, 0x7000, trampoline, &returns),
            0x401234
        );
        assert_eq!(
            original_return(trampoline, 0x7100, trampoline, &returns),
            0x405678
        );
        // Not a trampoline: the value as read, even in a recorded slot.
        assert_eq!(
            original_return(0x402000, 0x7000, trampoline, &returns),
            0x402000
        );
        // A trampoline in a slot nothing recorded stays (and ends the stack as unmapped).
        assert_eq!(
            original_return(trampoline, 0x7200, trampoline, &returns),
            trampoline
        );
    }

    #[test]
    fn a_small_window_ends_in_window() {
        let copied = level_one(64);
        let mut unwinders = Unwinders::default();
        unwinders.rebuild(1, 0, own_modules());
        let (frames, end) = unwinders.unwind(1, &copied, true, sampler_common::UPROBE_TRAMPOLINE);
        assert_eq!(end, StackEnd::Window, "{frames:x?}");
    }
}
