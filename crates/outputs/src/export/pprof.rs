//! pprof export: gzipped `profile.proto` (github.com/google/pprof/proto/profile.proto), with
//! Go's heap-profile conventions so `go tool pprof` and every pprof UI read it as a heap
//! profile: sample types `alloc_objects/count`, `alloc_space/bytes`, `inuse_objects/count`,
//! `inuse_space/bytes` (values already scaled to estimates, as Go's are), then
//! `peak_objects/count`, `peak_space/bytes` where a peak was kept (live at the process's
//! peak, `-sample_index=peak_space`), `period_type` `space/bytes` with the mean sampling interval as `period`;
//! the default sample type is the one the other outputs open on ([`Value::default_for`]).
//!
//! Locations carry file offsets inside their mapping (memory_start 0, file_offset 0), and
//! are already symbolized (`has_functions`), so pprof does not try to re-symbolize them;
//! inlined calls are extra lines of one location, innermost first, as the format wants.
//! Samples carry `pid` (numeric), `command` and, when known, `cgroup` labels, for
//! `-tagfocus` and `-tagroot` (a container's or a systemd unit's processes together).

use std::{collections::HashMap, io::Write};

use flate2::{write::GzEncoder, Compression};
use prost::Message;

use super::Value;
use crate::{
    schema::{Profile, StackProfile, ThreadValues},
    stacks::symbolize::FrameInfo,
};

/// `profile.proto` messages, field numbers as in the upstream schema.
pub mod proto {
    #![allow(missing_docs)]

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
        #[prost(int64, tag = "3")]
        pub column: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// Sample types, in value order (Go's heap profile).
pub const SAMPLE_TYPES: [(&str, &str); 6] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
    ("peak_objects", "count"),
    ("peak_space", "bytes"),
];

/// The sample types of `profile`: the last two only where it kept a peak.
pub fn sample_types(profile: &Profile) -> &'static [(&'static str, &'static str)] {
    if has_peak(profile) {
        &SAMPLE_TYPES
    } else {
        &SAMPLE_TYPES[..4]
    }
}

fn has_peak(profile: &Profile) -> bool {
    profile.stacks.iter().any(|s| s.peak_bytes.is_some())
}

/// The sample type of `value`.
fn sample_type_of(value: Value) -> &'static str {
    match value {
        Value::AllocObjects => "alloc_objects",
        Value::AllocBytes => "alloc_space",
        Value::InuseObjects => "inuse_objects",
        Value::InuseBytes => "inuse_space",
        Value::PeakObjects => "peak_objects",
        Value::PeakBytes => "peak_space",
    }
}

/// Interns strings; index 0 is the empty string, as the format requires.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut strings = Strings::default();
        strings.id("");
        strings
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.index.get(s) {
            return id;
        }
        let id = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), id);
        id
    }
}

/// What makes a location one: its module, address and (function, line) per inlined frame.
type LocationKey<'a> = (Option<&'a str>, u64, Vec<(u64, i64)>);

/// The profile's tables under construction: strings, mappings, functions and locations,
/// each entry made once and referred to by id.
struct Tables<'a> {
    strings: Strings,
    mappings: Vec<proto::Mapping>,
    mapping_ids: HashMap<&'a str, u64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(String, String), u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<LocationKey<'a>, u64>,
}

impl<'a> Tables<'a> {
    /// Tables with one mapping per module of `profile` (with its build id).
    fn new(profile: &'a Profile) -> Tables<'a> {
        let mut tables = Tables {
            strings: Strings::new(),
            mappings: Vec::new(),
            mapping_ids: HashMap::new(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
        };
        for module in &profile.modules {
            let id = tables.mappings.len() as u64 + 1;
            let mapping = proto::Mapping {
                id,
                memory_start: 0,
                memory_limit: u64::MAX,
                file_offset: 0,
                filename: tables.strings.id(&module.path),
                build_id: tables.strings.id(module.build_id.as_deref().unwrap_or("")),
                has_functions: true,
                has_filenames: true,
                has_line_numbers: true,
                has_inline_frames: true,
            };
            tables.mappings.push(mapping);
            tables.mapping_ids.insert(module.path.as_str(), id);
        }
        tables
    }

    /// The id of the function named `name` in source file `file`.
    fn function(&mut self, name: String, file: String) -> u64 {
        let next = self.functions.len() as u64 + 1;
        let Tables {
            strings, functions, ..
        } = self;
        *self
            .function_ids
            .entry((name, file))
            .or_insert_with_key(|(name, file)| {
                functions.push(proto::Function {
                    id: next,
                    name: strings.id(name),
                    system_name: strings.id(name),
                    filename: strings.id(file),
                    start_line: 0,
                });
                next
            })
    }

    /// The id of the location of `group`: frames with one return address (inlined calls),
    /// innermost first.
    fn location(&mut self, group: &'a [FrameInfo]) -> u64 {
        let lines: Vec<proto::Line> = group
            .iter()
            .map(|frame| proto::Line {
                function_id: self.function(
                    pprof_function_name(frame),
                    frame.file.as_deref().unwrap_or_default().to_owned(),
                ),
                line: frame.line.map_or(0, i64::from),
                column: 0,
            })
            .collect();
        let first = &group[0];
        let key = (
            first.module.as_deref(),
            first.address,
            lines
                .iter()
                .map(|l| (l.function_id, l.line))
                .collect::<Vec<_>>(),
        );
        let next = self.locations.len() as u64 + 1;
        let Tables {
            mapping_ids,
            locations,
            ..
        } = self;
        *self.location_ids.entry(key).or_insert_with(|| {
            locations.push(proto::Location {
                id: next,
                mapping_id: first
                    .module
                    .as_deref()
                    .and_then(|m| mapping_ids.get(m).copied())
                    .unwrap_or(0),
                address: first.address,
                line: lines,
                is_folded: false,
            });
            next
        })
    }
}

/// A frame's function name for pprof: its function alone (the file and line go apart). A
/// Python name in angle brackets (`<module>`, `<lambda>` at a module's top) is qualified
/// with its module's name (`app.<module>`): `go tool pprof` takes a name with `<…>` and no
/// `.<` for a demangled C++ one, strips the brackets as template arguments and shows
/// nothing (`<unknown>` in `-traces`).
fn pprof_function_name(frame: &FrameInfo) -> String {
    let name = crate::format::function_name(frame);
    let python = frame.kind == Some(crate::stacks::symbolize::FrameKind::Python);
    match (python, frame.file.as_deref()) {
        (true, Some(file)) if name.starts_with('<') => {
            let base = file.rsplit('/').next().unwrap_or(file);
            format!("{}.{name}", base.strip_suffix(".py").unwrap_or(base))
        }
        _ => name,
    }
}

/// A sample's labels: its process's pid, command and (if known) cgroup.
fn labels(
    strings: &mut Strings,
    pid: u32,
    command: &str,
    cgroup: Option<&str>,
) -> Vec<proto::Label> {
    let mut labels = vec![
        proto::Label {
            key: strings.id("pid"),
            num: i64::from(pid),
            ..Default::default()
        },
        proto::Label {
            key: strings.id("command"),
            str: strings.id(command),
            ..Default::default()
        },
    ];
    if let Some(cgroup) = cgroup {
        labels.push(proto::Label {
            key: strings.id("cgroup"),
            str: strings.id(cgroup),
            ..Default::default()
        });
    }
    labels
}

/// The samples of one stack at `location_id`, labelled `label`: one, or (split by thread)
/// one per thread, labelled `thread`, `thread_id`, holding what it allocated, and one
/// unlabelled holding what is in use (not known per thread).
fn stack_samples(
    samples: &mut Vec<proto::Sample>,
    strings: &mut Strings,
    stack: &StackProfile,
    location_id: Vec<u64>,
    label: Vec<proto::Label>,
    types: usize,
) {
    let value = |estimate: Option<f64>| estimate.map_or(0, |v| v.round() as i64);
    let live = [
        value(stack.inuse_objects.map(|e| e.estimate)),
        value(stack.inuse_bytes.map(|e| e.estimate)),
        value(stack.peak_objects.map(|e| e.estimate)),
        value(stack.peak_bytes.map(|e| e.estimate)),
    ];
    let live = &live[..types - 2];
    if stack.threads.is_empty() {
        let mut values = vec![
            value(Some(stack.alloc_objects.estimate)),
            value(Some(stack.alloc_bytes.estimate)),
        ];
        values.extend(live);
        samples.push(proto::Sample {
            location_id,
            value: values,
            label,
        });
        return;
    }
    for thread in &stack.threads {
        let mut label = label.clone();
        label.extend(thread_labels(strings, thread));
        samples.push(proto::Sample {
            location_id: location_id.clone(),
            value: {
                let mut values = vec![0; types];
                values[0] = value(Some(thread.alloc_objects.estimate));
                values[1] = value(Some(thread.alloc_bytes.estimate));
                values
            },
            label,
        });
    }
    if live.iter().any(|&v| v != 0) {
        let mut values = vec![0, 0];
        values.extend(live);
        samples.push(proto::Sample {
            location_id,
            value: values,
            label,
        });
    }
}

/// A thread's labels: its name (`thread`, sanitized; `other threads` for those beyond the
/// ones kept apart) and id (`thread_id`).
fn thread_labels(strings: &mut Strings, thread: &ThreadValues) -> Vec<proto::Label> {
    let name = match (thread.tid, thread.name.is_empty()) {
        (None, _) => "other threads".to_owned(),
        (Some(tid), true) => format!("tid {tid}"),
        (Some(_), false) => crate::text::printable(&thread.name).into_owned(),
    };
    let mut labels = vec![proto::Label {
        key: strings.id("thread"),
        str: strings.id(&name),
        ..Default::default()
    }];
    if let Some(tid) = thread.tid {
        labels.push(proto::Label {
            key: strings.id("thread_id"),
            num: i64::from(tid),
            ..Default::default()
        });
    }
    labels
}

/// What the profile's values are, said in its comments (pprof shows them).
fn comments(profile: &Profile) -> Vec<String> {
    let mut comments = vec![
        format!(
            "allocscope: sampled every {} bytes on average; values are estimates (bounds in the JSON export)",
            profile.sampling.mean_interval_bytes
        ),
        if profile.alloc_only {
            "frees not tracked: inuse_* and peak_* are 0".to_owned()
        } else {
            format!(
                "inuse_* cover allocations made since {}; peak_* what was in use when each \
                 process's in-use total was highest",
                if profile.all_seen_from_their_start() {
                    "each process started"
                } else {
                    "attach"
                }
            )
        },
    ];
    if let Some(duty) = &profile.sampling.duty {
        comments.push(format!(
            "duty-cycled (--max-overhead {:.1}%): probes attached {:.1}% of the time; values \
             are estimated over the whole time",
            duty.max_overhead * 100.0,
            duty.observed_share * 100.0
        ));
    }
    comments
}

/// Builds the profile message (exposed for tests and readers).
pub fn build(profile: &Profile) -> proto::Profile {
    let mut tables = Tables::new(profile);
    let types = sample_types(profile);
    let sample_type: Vec<proto::ValueType> = types
        .iter()
        .map(|(kind, unit)| proto::ValueType {
            r#type: tables.strings.id(kind),
            unit: tables.strings.id(unit),
        })
        .collect();
    let processes = profile.process_labels();
    let mut samples = Vec::with_capacity(profile.stacks.len());
    for stack in &profile.stacks {
        let location_id = stack
            .frames
            // Inlined native calls share their return address: one location. Python frames
            // have none (address 0): each is a location of its own.
            .chunk_by(|a, b| {
                a.kind.is_none()
                    && b.kind.is_none()
                    && a.module == b.module
                    && a.address == b.address
            })
            .map(|group| tables.location(group))
            .collect();
        let (command, cgroup) = processes.get(&stack.pid).copied().unwrap_or(("", None));
        let label = labels(&mut tables.strings, stack.pid, command, cgroup);
        stack_samples(
            &mut samples,
            &mut tables.strings,
            stack,
            location_id,
            label,
            types.len(),
        );
    }
    let Tables {
        mut strings,
        mappings,
        functions,
        locations,
        ..
    } = tables;
    let comments = comments(profile);
    let comment = comments.iter().map(|c| strings.id(c)).collect();
    let default_sample_type = strings.id(sample_type_of(Value::default_for(profile)));
    let period_type = Some(proto::ValueType {
        r#type: strings.id("space"),
        unit: strings.id("bytes"),
    });
    proto::Profile {
        sample_type,
        sample: samples,
        mapping: mappings,
        location: locations,
        function: functions,
        string_table: strings.table,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: 0,
        duration_nanos: (profile.duration_seconds * 1e9) as i64,
        period_type,
        period: profile.sampling.mean_interval_bytes as i64,
        comment,
        default_sample_type,
    }
}

/// Writes `profile` as gzipped profile.proto.
pub fn write(profile: &Profile, out: &mut dyn Write) -> std::io::Result<()> {
    write_message(&build(profile), out)
}

/// Writes `profile` with `notes` as its comments instead of a recording's (a profile of
/// differences, whose values mean something else).
pub fn write_noted(
    profile: &Profile,
    notes: &[String],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut message = build(profile);
    message.comment = notes
        .iter()
        .map(|note| {
            message.string_table.push(note.clone());
            message.string_table.len() as i64 - 1
        })
        .collect();
    write_message(&message, out)
}

fn write_message(message: &proto::Profile, out: &mut dyn Write) -> std::io::Result<()> {
    let bytes = message.encode_to_vec();
    let mut gzip = GzEncoder::new(out, Compression::default());
    gzip.write_all(&bytes)?;
    gzip.finish()?;
    Ok(())
}

/// Decodes a (gzipped or plain) profile.proto, for round-trip tests and checks.
pub fn read(bytes: &[u8]) -> std::io::Result<proto::Profile> {
    let plain = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut out)?;
        out
    } else {
        bytes.to_vec()
    };
    proto::Profile::decode(plain.as_slice()).map_err(std::io::Error::other)
}
