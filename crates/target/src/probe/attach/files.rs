//! Attaching the probes of one allocator file in a scope: the in-process front end's USDT
//! sites, another producer's, or the frees and then the allocation functions (entry and
//! return).

use super::*;

impl Probes {
    pub(super) fn map_mut<'a, T: TryFrom<&'a mut aya::maps::Map>>(
        &'a mut self,
        name: &str,
    ) -> Result<T, AttachError> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| AttachError::MapMissing(name.to_owned()))?;
        T::try_from(map).map_err(|_| AttachError::MapMissing(format!("{name} of the right type")))
    }

    /// Raises the kernel's per-function code sizes to cover `allocator`'s functions.
    pub(super) fn note_sizes(&mut self, allocator: &Allocator) -> Result<(), AttachError> {
        let mut changed = Vec::new();
        for f in &allocator.file.functions {
            let index = f.function as usize;
            if f.size > self.sizes[index] {
                self.sizes[index] = f.size;
                changed.push((index as u32, f.size));
            }
        }
        if changed.is_empty() {
            return Ok(());
        }
        let mut map: Array<&mut MapData, u64> = self.map_mut(kernel::maps::FUNCTION_SIZES)?;
        for (index, size) in changed {
            map.set(index, size, 0)
                .map_err(|e| AttachError::map(kernel::maps::FUNCTION_SIZES, e))?;
        }
        Ok(())
    }

    /// Attaches the probes of one allocator file in `scope`: the front end's USDT sites, or
    /// the frees then the allocation functions.
    pub(super) fn attach_file(
        &mut self,
        scope: Scope,
        allocator: &Allocator,
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        if let Some(front_end) = &allocator.file.front_end {
            return self.attach_front_end(scope, allocator, front_end);
        }
        if let Some(producer) = &allocator.file.producer {
            return self.attach_producer(scope, allocator, producer);
        }
        self.uprobe_programs()?;
        let mut points = Vec::new();
        if self.config.track_frees.is_some() {
            points.extend(self.attach_frees(scope, allocator)?);
        }
        points.extend(self.attach_allocations(scope, allocator)?);
        Ok(points)
    }

    /// Where `producer`'s argument specs start in the kernel's table, written there at the
    /// file's first attach.
    fn producer_specs(
        &mut self,
        allocator: &Allocator,
        producer: &crate::probe::usdt::Producer,
    ) -> Result<u32, AttachError> {
        if let Some(&base) = self.specs.get(&allocator.file_id) {
            return Ok(base);
        }
        let base = self.next_spec;
        let count = producer.sites.len() as u32;
        if base + count > sampler_common::usdt::MAX_SPECS {
            return Err(AttachError::MissingProgram(format!(
                "room for {count} probe specs ({base} in use)"
            )));
        }
        let mut table: Array<&mut MapData, sampler_common::usdt::UsdtSpec> =
            self.map_mut(kernel::maps::USDT_SPECS)?;
        for (index, (_, spec)) in producer.sites.iter().enumerate() {
            table
                .set(base + index as u32, spec, 0)
                .map_err(|e| AttachError::map(kernel::maps::USDT_SPECS, e))?;
        }
        self.next_spec += count;
        self.specs.insert(allocator.file_id.clone(), base);
        Ok(base)
    }

    /// Loads the producers' program at the first process with such probes (see the eBPF
    /// program's docs); `provider` names them in the error.
    fn load_producers(&mut self, provider: &str) -> Result<(), AttachError> {
        if self.producers.is_none() && self.front_end.is_some() {
            self.producers = super::load::load_multi(
                &self.relocated,
                kernel::programs::PRODUCER,
                session::BPF_TRACE_UPROBE_MULTI,
            );
        }
        if self.producers.is_none() {
            return Err(AttachError::MissingProgram(format!(
                "{provider} probes need uprobe_multi links (kernel ≥ 6.6)"
            )));
        }
        Ok(())
    }

    /// Another program's allocation probes (`otel_memory`, `ddheap`): each site's argument
    /// spec goes into the kernel's table (once per file), then every site is attached as
    /// one link, `free` sites first (frees tracked), semaphores raised while attached.
    pub(super) fn attach_producer(
        &mut self,
        scope: Scope,
        allocator: &Allocator,
        producer: &crate::probe::usdt::Producer,
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        self.load_producers(&producer.provider)?;
        let tracking = self.config.track_frees.is_some();
        let mut sites: Vec<&(crate::probe::usdt::Site, sampler_common::usdt::UsdtSpec)> = producer
            .sites
            .iter()
            .filter(|(_, spec)| tracking || !is_free_kind(spec.kind))
            .collect();
        sites.sort_by_key(|(_, spec)| !is_free_kind(spec.kind));
        let base = self.producer_specs(allocator, producer)?;
        let index_of = |site: &crate::probe::usdt::Site| {
            producer
                .sites
                .iter()
                .position(|(s, _)| s == site)
                .unwrap_or(0) as u32
        };
        let offsets: Vec<u64> = sites.iter().map(|(site, _)| site.file_offset).collect();
        let cookies: Vec<u64> = sites
            .iter()
            .map(|(site, _)| sampler_common::cookie::producer(base + index_of(site), scope.slot()))
            .collect();
        let semaphores: Vec<u64> = sites
            .iter()
            .map(|(site, _)| site.semaphore.unwrap_or(0))
            .collect();
        let any_semaphore = semaphores.iter().any(|&s| s != 0);
        let names: Vec<String> = sites
            .iter()
            .map(|(site, _)| format!("{}:{}", site.provider, site.name))
            .collect();
        if offsets.is_empty() {
            return Ok(Vec::new());
        }
        let program = self.producers.as_ref().expect("checked above");
        let link = program
            .link_with_semaphores(
                &allocator.path,
                scope.key(),
                &offsets,
                &cookies,
                any_semaphore.then_some(semaphores.as_slice()),
            )
            .map_err(|source| AttachError::Attach {
                symbol: names[0].clone(),
                path: allocator.shown.clone(),
                pid: scope.key(),
                source: Box::new(source),
            })?;
        self.links
            .entry(scope.key())
            .or_default()
            .push(Link::Multi(link));
        let points = sites.iter().zip(names).map(|((site, _), name)| {
            let mut point = usdt_point(scope, allocator, site.file_offset, name);
            if let Some(probed) = &site.probed {
                point.placement = probed.clone();
                point.file_offset -= probed.offset;
            }
            point
        });
        Ok(points.collect())
    }

    /// The in-process front end's `free` sites (frees tracked) then its `alloc` sites, on
    /// the 5-byte nop where the kernel optimises such probes, as one link (one program,
    /// the cookie telling a `free` site from an `alloc` one).
    pub(super) fn attach_front_end(
        &mut self,
        scope: Scope,
        allocator: &Allocator,
        front_end: &crate::probe::usdt::FrontEnd,
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        let slot = u64::from(scope.slot());
        let mut sites: Vec<(&crate::probe::usdt::Site, u64)> = Vec::new();
        if self.config.track_frees.is_some() {
            let free = sampler_common::cookie::with_front_end_free(slot);
            sites.extend(front_end.frees.iter().map(|site| (site, free)));
        }
        sites.extend(front_end.allocs.iter().map(|site| (site, slot)));
        if scope == Scope::Host {
            // File-wide probes behind it learn from its start that a process carries it.
            let ready = sampler_common::cookie::front_end_ready(scope.slot());
            sites.extend(front_end.ready.iter().map(|site| (site, ready)));
        }
        // At the 1-byte nop (an int3 trap) unless asked: an optimised site's code calls a
        // trampoline mapping that a fork does not copy (Linux 6.18), so a child forked
        // without exec would crash at the site.
        let optimized = crate::probe::usdt_optimized() && self.config.usdt_nop5;
        let nop5 = |site: &crate::probe::usdt::Site| site.optimizable && optimized;
        let offsets: Vec<u64> = sites
            .iter()
            .map(|(site, _)| site.file_offset + u64::from(nop5(site)))
            .collect();
        let cookies: Vec<u64> = sites.iter().map(|&(_, cookie)| cookie).collect();
        let names: Vec<String> = sites
            .iter()
            .map(|(site, _)| format!("{}:{}", site.provider, site.name))
            .collect();
        if offsets.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(multi) = &self.front_end {
            let link = multi_link(multi, scope, allocator, &offsets, &cookies, &names[0])?;
            self.links
                .entry(scope.key())
                .or_default()
                .push(Link::Multi(link));
        } else {
            for ((name, &offset), &cookie) in names.iter().zip(&offsets).zip(&cookies) {
                let id = self.attach_uprobe(
                    kernel::programs::USDT,
                    scope,
                    allocator,
                    offset,
                    cookie,
                    name,
                )?;
                self.links
                    .entry(scope.key())
                    .or_default()
                    .push(Link::Uprobe(kernel::programs::USDT, id));
            }
        }
        let points = sites
            .iter()
            .zip(names)
            .map(|(&(site, _), name)| AttachedPoint {
                pid: scope.key(),
                probe: ProbeKind::Usdt(name),
                path: allocator.shown.clone(),
                file_offset: site.file_offset,
                placement: Placement {
                    offset: u64::from(nop5(site)),
                    instruction: if nop5(site) {
                        "nop5 (optimised)"
                    } else {
                        "nop"
                    }
                    .to_owned(),
                    emulated: true,
                    moved: Vec::new(),
                },
            });
        Ok(points.collect())
    }

    pub(super) fn attach_frees(
        &mut self,
        scope: Scope,
        allocator: &Allocator,
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        let frees = &allocator.file.frees;
        let points = frees
            .iter()
            .map(|free| AttachedPoint {
                pid: scope.key(),
                probe: ProbeKind::Free(free.symbol.clone()),
                path: allocator.shown.clone(),
                file_offset: free.file_offset,
                placement: free.probe.clone(),
            })
            .collect();
        let offsets: Vec<u64> = frees
            .iter()
            .map(|free| free.file_offset + free.probe.offset)
            .collect();
        let cookie = u64::from(scope.slot());
        let program = self.uprobes.as_ref().and_then(|u| u.frees.as_ref());
        if let Some(program) = program.filter(|_| !offsets.is_empty()) {
            let cookies = vec![cookie; offsets.len()];
            let link = multi_link(
                program,
                scope,
                allocator,
                &offsets,
                &cookies,
                "free functions",
            )?;
            self.links
                .entry(scope.key())
                .or_default()
                .push(Link::Multi(link));
            return Ok(points);
        }
        for (free, offset) in frees.iter().zip(offsets) {
            let id = self.attach_uprobe(
                kernel::programs::FREE,
                scope,
                allocator,
                offset,
                cookie,
                &free.symbol,
            )?;
            self.links
                .entry(scope.key())
                .or_default()
                .push(Link::Uprobe(kernel::programs::FREE, id));
        }
        Ok(points)
    }

    pub(super) fn attach_allocations(
        &mut self,
        scope: Scope,
        allocator: &Allocator,
    ) -> Result<Vec<AttachedPoint>, AttachError> {
        let functions = &allocator.file.functions;
        // glibc's malloc is the innermost; another's may wrap it (or reach another).
        let outer = allocator.file.kind != crate::probe::allocator::AllocatorKind::Glibc;
        let served = allocator.served_by_front_end();
        let point = |probe: ProbeKind, f: &crate::probe::allocator::Function| AttachedPoint {
            pid: scope.key(),
            probe,
            path: allocator.shown.clone(),
            file_offset: f.file_offset,
            placement: f.probe.clone(),
        };
        let mut points = Vec::new();
        if let Some(sessions) = self.uprobes.as_ref().and_then(|u| u.sessions.as_ref()) {
            let offsets: Vec<u64> = functions
                .iter()
                .map(|f| f.file_offset + f.probe.offset)
                .collect();
            let cookies: Vec<u64> = functions
                .iter()
                .map(|f| f.cookie(scope.slot(), outer, served))
                .collect();
            let what = "allocation functions (session)";
            let link = multi_link(sessions, scope, allocator, &offsets, &cookies, what)?;
            self.links
                .entry(scope.key())
                .or_default()
                .push(Link::Multi(link));
            // Without frees tracked the link is a plain uprobe_multi one: entries only.
            let kind = |symbol: String| match self.config.track_frees {
                Some(_) => ProbeKind::Session(symbol),
                None => ProbeKind::Entry(symbol),
            };
            points.extend(functions.iter().map(|f| point(kind(f.symbol.clone()), f)));
            return Ok(points);
        }
        for f in functions {
            let offset = f.file_offset + f.probe.offset;
            let mut programs = vec![(program_name(f.function), ProbeKind::Entry(f.symbol.clone()))];
            if self.config.track_frees.is_some() {
                // At the same point as the entry, where `[rsp]` is still the return address.
                programs.push((
                    kernel::programs::RETURN,
                    ProbeKind::Return(f.symbol.clone()),
                ));
            }
            for (name, kind) in programs {
                let cookie = f.cookie(scope.slot(), outer, served);
                let id = self.attach_uprobe(name, scope, allocator, offset, cookie, &f.symbol)?;
                self.links
                    .entry(scope.key())
                    .or_default()
                    .push(Link::Uprobe(name, id));
                points.push(point(kind, f));
            }
        }
        Ok(points)
    }

    pub(super) fn attach_uprobe(
        &mut self,
        name: &'static str,
        scope: Scope,
        allocator: &Allocator,
        offset: u64,
        cookie: u64,
        symbol: &str,
    ) -> Result<UProbeLinkId, AttachError> {
        let program = uprobe(&mut self.ebpf, name)?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: Some(cookie),
        };
        program
            .attach(point, &allocator.path, scope.uprobe_scope())
            .map_err(|source| AttachError::Attach {
                symbol: symbol.to_owned(),
                path: allocator.shown.clone(),
                pid: scope.key(),
                source: Box::new(source),
            })
    }
}

/// Links `program` at `offsets` of `allocator`'s file in `scope`, one cookie each;
/// `what` names the functions in an error.
pub(super) fn multi_link(
    program: &session::MultiProgram,
    scope: Scope,
    allocator: &Allocator,
    offsets: &[u64],
    cookies: &[u64],
    what: &str,
) -> Result<OwnedFd, AttachError> {
    program
        .link(&allocator.path, scope.key(), offsets, cookies)
        .map_err(|source| AttachError::Attach {
            symbol: what.to_owned(),
            path: allocator.shown.clone(),
            pid: scope.key(),
            source: Box::new(source),
        })
}

/// The uprobe program `name` of the object (loaded by [`Probes::load`]).
pub(super) fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, AttachError> {
    program(ebpf, name)
}

/// Program `name` of the object, as its type `T` (`UProbe`, `TracePoint`…).
pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, AttachError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| AttachError::MissingProgram(name.to_owned()))?
        .try_into()
        .map_err(load_failed(name))
}

/// The error of loading (or finding) program `name`.
pub(super) fn load_failed(
    name: &str,
) -> impl FnOnce(aya::programs::ProgramError) -> AttachError + '_ {
    move |source| AttachError::LoadProgram {
        program: name.to_owned(),
        source,
    }
}

/// The uprobe program `name` of the object, loaded into the kernel (verified).
pub(super) fn loaded_uprobe<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<&'a mut UProbe, AttachError> {
    let program = uprobe(ebpf, name)?;
    program.load().map_err(load_failed(name))?;
    Ok(program)
}

/// A USDT site attached in `scope` (a nop: emulated, nothing moved).
fn usdt_point(
    scope: Scope,
    allocator: &Allocator,
    file_offset: u64,
    name: String,
) -> AttachedPoint {
    AttachedPoint {
        pid: scope.key(),
        probe: ProbeKind::Usdt(name),
        path: allocator.shown.clone(),
        file_offset,
        placement: Placement {
            offset: 0,
            instruction: "nop".to_owned(),
            emulated: true,
            moved: Vec::new(),
        },
    }
}

/// Whether a producer's site reports frees (attached only when they are tracked).
fn is_free_kind(kind: u32) -> bool {
    use sampler_common::usdt::{
        KIND_FREE, KIND_RUNTIME_FREED, KIND_RUNTIME_FREEING, KIND_RUNTIME_FREE_IF,
    };
    [
        KIND_FREE,
        KIND_RUNTIME_FREEING,
        KIND_RUNTIME_FREED,
        KIND_RUNTIME_FREE_IF,
    ]
    .contains(&kind)
}

/// The eBPF program probing `function`'s entry.
pub fn program_name(function: AllocFn) -> &'static str {
    match function {
        AllocFn::Malloc => kernel::programs::MALLOC,
        AllocFn::Calloc => kernel::programs::CALLOC,
        AllocFn::Realloc => kernel::programs::REALLOC,
        AllocFn::PosixMemalign => kernel::programs::POSIX_MEMALIGN,
        AllocFn::AlignedAlloc => kernel::programs::ALIGNED_ALLOC,
        AllocFn::Memalign => kernel::programs::MEMALIGN,
        AllocFn::Valloc => kernel::programs::VALLOC,
        AllocFn::Pvalloc => kernel::programs::PVALLOC,
        AllocFn::New => kernel::programs::NEW,
    }
}
