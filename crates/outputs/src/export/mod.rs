//! ⑥ One exporter per format, each over `&Profile`.

pub(crate) mod folded;
pub mod html;
pub(crate) mod json;
pub mod pprof;
pub(crate) mod speedscope;
pub(crate) mod svg;

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::SystemTime,
};

use crate::{
    outfile,
    schema::{Opening, Profile, StackProfile},
};

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The `allocscope/v1` JSON schema (estimates with bounds); `allocscope report` reads it.
    Json,
    /// Gzipped pprof profile.proto (Go heap-profile sample types) for `go tool pprof`.
    Pprof,
    /// Folded stacks (`root;...;leaf value`) for flamegraph.pl and inferno.
    Folded,
    /// Interactive SVG flame graph.
    Svg,
    /// Self-contained HTML report: flame graph with bounds, tables, charts (offline).
    Html,
    /// speedscope's file format (one profile per value).
    Speedscope,
}

impl Format {
    /// The name users type (`--format NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Pprof => "pprof",
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Html => "html",
            Format::Speedscope => "speedscope",
        }
    }

    /// The usual file extension (for snapshot file names).
    pub fn extension(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Pprof => "pb.gz",
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Html => "html",
            Format::Speedscope => "speedscope.json",
        }
    }

    /// The format a file name implies: `.pb.gz`/`.pb`/`.pprof` → pprof, `.folded`/`.txt` →
    /// folded, `.svg` → svg, `.html`/`.htm` → html, `.speedscope.json` → speedscope, `.json` or
    /// no extension → json. Any other extension is an error that lists these (`-o x.htm5`
    /// must not silently get JSON).
    pub fn for_path(path: &Path) -> Result<Format, String> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".pb.gz") || name.ends_with(".pb") || name.ends_with(".pprof") {
            Ok(Format::Pprof)
        } else if name.ends_with(".folded") || name.ends_with(".txt") {
            Ok(Format::Folded)
        } else if name.ends_with(".svg") {
            Ok(Format::Svg)
        } else if name.ends_with(".html") || name.ends_with(".htm") {
            Ok(Format::Html)
        } else if name.ends_with(".speedscope.json") {
            Ok(Format::Speedscope)
        } else if name.ends_with(".json") {
            Ok(Format::Json)
        } else {
            match Path::new(name).extension() {
                None => Ok(Format::Json),
                Some(extension) => Err(format!(
                    "{}: unknown extension .{} (known: .json, .pb.gz, .pb, .pprof, .folded, \
                     .txt, .svg, .html, .speedscope.json; or name the format with --format)",
                    path.display(),
                    extension.to_string_lossy()
                )),
            }
        }
    }
}

/// Which number the folded and SVG outputs show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Value {
    /// Estimated bytes allocated.
    AllocBytes,
    /// Estimated allocations.
    AllocObjects,
    /// Estimated bytes still live (needs free tracking).
    InuseBytes,
    /// Estimated allocations still live (needs free tracking).
    InuseObjects,
    /// Estimated bytes live when the process's live total was highest (needs free tracking).
    PeakBytes,
    /// Estimated allocations live then (needs free tracking).
    PeakObjects,
}

impl Value {
    /// The value of `stack` (0 where frees were not tracked).
    pub fn of(self, stack: &StackProfile) -> f64 {
        match self {
            Value::AllocBytes => stack.alloc_bytes.estimate,
            Value::AllocObjects => stack.alloc_objects.estimate,
            Value::InuseBytes => stack.inuse_bytes.map_or(0.0, |e| e.estimate),
            Value::InuseObjects => stack.inuse_objects.map_or(0.0, |e| e.estimate),
            Value::PeakBytes => stack.peak_bytes.map_or(0.0, |e| e.estimate),
            Value::PeakObjects => stack.peak_objects.map_or(0.0, |e| e.estimate),
        }
    }

    /// Whether it counts bytes (else allocations).
    pub fn is_bytes(self) -> bool {
        matches!(
            self,
            Value::AllocBytes | Value::InuseBytes | Value::PeakBytes
        )
    }

    /// Its name on the command line (`--value`).
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|p| p.get_name().to_owned())
            .unwrap_or_default()
    }

    /// Whether it needs frees tracked (`inuse-*`, `peak-*`): such a graph of an
    /// `--alloc-only` recording would be empty.
    pub fn needs_frees(self) -> bool {
        !matches!(self, Value::AllocBytes | Value::AllocObjects)
    }

    /// What a unit of it is, for titles.
    pub fn describe(self) -> &'static str {
        match self {
            Value::AllocBytes => "estimated bytes allocated",
            Value::AllocObjects => "estimated allocations",
            Value::InuseBytes => "estimated bytes in use",
            Value::InuseObjects => "estimated allocations in use",
            Value::PeakBytes => "estimated bytes in use at the peak",
            Value::PeakObjects => "estimated allocations in use at the peak",
        }
    }

    /// The default for a profile: the bytes of what it opens on ([`Profile::opens_on`]).
    pub fn default_for(profile: &Profile) -> Value {
        match profile.opens_on() {
            Opening::Peak => Value::PeakBytes,
            Opening::Live => Value::InuseBytes,
            Opening::Allocated => Value::AllocBytes,
        }
    }

    /// Where `format` shows `self` alone (folded, SVG) or opens on it (HTML, speedscope) and
    /// it is 0 for every stack of `profile`: what to say, naming a value that has data.
    pub fn empty_in(self, profile: &Profile, format: Format) -> Option<String> {
        if matches!(format, Format::Json | Format::Pprof) || profile.stacks.is_empty() {
            return None;
        }
        if profile.stacks.iter().any(|s| self.of(s) > 0.0) {
            return None;
        }
        let instead = [Value::PeakBytes, Value::AllocBytes, Value::InuseBytes]
            .into_iter()
            .find(|v| profile.stacks.iter().any(|s| v.of(s) > 0.0))?;
        Some(format!(
            "the {} ({}) is 0 for every stack: the {} shows nothing; {} has data: --value {}",
            self.describe(),
            self.name(),
            format.name(),
            instead.describe(),
            instead.name()
        ))
    }
}

/// Writes `profile` in `format`; `value` picks the number of folded and SVG output (and
/// the one the HTML report and speedscope open on).
pub fn write(
    profile: &Profile,
    format: Format,
    value: Value,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    match format {
        Format::Json => json::write(profile, out),
        Format::Pprof => pprof::write(profile, out),
        Format::Folded => folded::write(profile, value, out),
        Format::Svg => svg::write(profile, value, out),
        Format::Html => html::write(profile, value, out),
        Format::Speedscope => speedscope::write(profile, value, out),
    }
}

/// Writes `profile` to `path` atomically and safely (see [`crate::outfile`]): a regular file
/// there is replaced, anything else refused.
pub fn write_file(
    profile: &Profile,
    format: Format,
    value: Value,
    path: &Path,
) -> std::io::Result<()> {
    outfile::write_replacing(path, |out| write(profile, format, value, out))
}

/// Writes `profile` as a new snapshot file in `dir`, named for `time` (see
/// [`snapshot_stem`]); never replaces a file. Returns the path written.
pub fn write_snapshot(
    profile: &Profile,
    format: Format,
    value: Value,
    dir: &Path,
    time: SystemTime,
) -> std::io::Result<PathBuf> {
    outfile::write_new(dir, &snapshot_stem(time), format.extension(), |out| {
        write(profile, format, value, out)
    })
}

/// Every snapshot file name starts with this.
pub const SNAPSHOT_PREFIX: &str = "allocscope-";

/// `allocscope-2026-11-22T02-41-34.123Z`: UTC, sortable, no `:` (awkward in shells and on
/// other file systems).
pub fn snapshot_stem(time: SystemTime) -> String {
    let stamp = humantime::format_rfc3339_millis(time)
        .to_string()
        .replace(':', "-");
    format!("{SNAPSHOT_PREFIX}{stamp}")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use allocscope_model::fixtures::{estimate, synthetic};

    #[test]
    fn snapshot_names_sort_by_time() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_795_000_000_123);
        let stem = snapshot_stem(t);
        assert_eq!(stem, "allocscope-2026-11-18T11-06-40.123Z");
        let later = snapshot_stem(t + std::time::Duration::from_millis(1));
        assert!(later > stem);
    }

    /// Every field a profile with the new breakdowns writes is named in
    /// docs/json-schema.md (growth, lifetimes, sizes, threads, timeline included).
    #[test]
    fn every_breakdown_field_is_documented() {
        use crate::schema::{
            GrowthValues, LifetimeValues, SeriesValues, SizeClassValues, ThreadValues,
        };
        let mut profile = synthetic();
        let e = estimate(1.0, 1);
        let growth = GrowthValues {
            bytes_per_second: e,
            growing: true,
            tick_seconds: 1.0,
        };
        let lifetimes = LifetimeValues {
            freed_samples: 1,
            temporary_bytes: e,
            freed_within_1ms: e,
            freed_within_1s: e,
            freed_later: e,
            still_in_use: e,
            p50_seconds: Some(1.0),
            p90_seconds: Some(1.0),
            p99_seconds: Some(1.0),
        };
        let timeline = SeriesValues {
            seconds_per_point: 1.0,
            at_seconds: vec![1.0],
            inuse_bytes: vec![1.0],
            inuse_lower: vec![1.0],
            inuse_upper: vec![1.0],
            alloc_bytes_per_second: vec![1.0],
            alloc_lower: vec![1.0],
            alloc_upper: vec![1.0],
        };
        let stack = &mut profile.stacks[0];
        stack.growth = Some(growth);
        stack.lifetimes = Some(lifetimes);
        stack.sizes = vec![SizeClassValues {
            from_bytes: 1,
            to_bytes: 2,
            alloc_bytes: e,
            alloc_objects: e,
        }];
        stack.threads = vec![ThreadValues {
            tid: Some(1),
            name: "t".into(),
            alloc_bytes: e,
            alloc_objects: e,
        }];
        stack.timeline = Some(timeline.clone());
        let process = &mut profile.processes[0];
        process.growth = Some(growth);
        process.lifetimes = Some(lifetimes);
        process.timeline = Some(timeline);
        let value = serde_json::to_value(&profile).unwrap();
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/json-schema.md"),
        )
        .unwrap();
        let mut missing = Vec::new();
        for part in ["growth", "lifetimes", "sizes", "threads", "timeline"] {
            for section in [&value["stacks"][0], &value["processes"][0]] {
                let Some(inner) = section.get(part) else {
                    continue;
                };
                let inner = inner.as_array().map_or(inner, |a| &a[0]);
                let keys = inner.as_object().unwrap().keys();
                for key in std::iter::once(part).chain(keys.map(String::as_str)) {
                    if !docs.contains(&format!("`{key}`")) && !docs.contains(&format!("`{key}[]`"))
                    {
                        missing.push(format!("{part}.{key}"));
                    }
                }
            }
        }
        assert!(
            missing.is_empty(),
            "not in docs/json-schema.md: {missing:?}"
        );
    }

    #[test]
    fn json_round_trips() {
        let profile = synthetic();
        let mut out = Vec::new();
        write(&profile, Format::Json, Value::AllocBytes, &mut out).unwrap();
        let back: Profile = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, profile);
    }

    /// A stack's per-thread split becomes one sample per thread, labelled, with what it
    /// allocated; in-use values (not known per thread) stay on one unlabelled sample.
    #[test]
    fn pprof_splits_a_stack_by_thread() {
        let mut profile = synthetic();
        profile.stacks.truncate(1);
        let stack = &mut profile.stacks[0];
        stack.inuse_bytes = Some(estimate(500.0, 3));
        stack.inuse_objects = Some(estimate(5.0, 3));
        stack.threads = vec![
            crate::schema::ThreadValues {
                tid: Some(7),
                name: "alpha\x1b[2J".into(),
                alloc_bytes: estimate(15000.0, 7),
                alloc_objects: estimate(70.0, 7),
            },
            crate::schema::ThreadValues {
                tid: None,
                name: String::new(),
                alloc_bytes: estimate(5000.0, 3),
                alloc_objects: estimate(30.0, 3),
            },
        ];
        let decoded = pprof::build(&profile);
        let string = |id: i64| decoded.string_table[id as usize].as_str();
        let values: Vec<&[i64]> = decoded.sample.iter().map(|s| s.value.as_slice()).collect();
        assert_eq!(
            values,
            [&[70, 15000, 0, 0][..], &[30, 5000, 0, 0], &[0, 0, 5, 500]]
        );
        let thread = |i: usize| {
            decoded.sample[i]
                .label
                .iter()
                .find(|l| string(l.key) == "thread")
                .map(|l| string(l.str).to_owned())
        };
        let name = thread(0).unwrap();
        assert!(
            name.starts_with("alpha") && !name.contains('\x1b'),
            "{name:?}"
        );
        assert_eq!(thread(1).as_deref(), Some("other threads"));
        assert_eq!(thread(2), None);
    }

    #[test]
    fn pprof_round_trips() {
        let profile = synthetic();
        let mut out = Vec::new();
        write(&profile, Format::Pprof, Value::AllocBytes, &mut out).unwrap();
        let decoded = pprof::read(&out).unwrap();
        let string = |id: i64| decoded.string_table[id as usize].as_str();
        let types: Vec<(&str, &str)> = decoded
            .sample_type
            .iter()
            .map(|t| (string(t.r#type), string(t.unit)))
            .collect();
        assert_eq!(types, pprof::SAMPLE_TYPES[..4]);
        assert_eq!(string(decoded.default_sample_type), "alloc_space");
        assert_eq!(decoded.period, 1024);
        let period_type = decoded.period_type.as_ref().unwrap();
        assert_eq!(
            (string(period_type.r#type), string(period_type.unit)),
            ("space", "bytes")
        );
        assert_eq!(decoded.sample.len(), 2);
        assert_eq!(decoded.sample[0].value, vec![100, 20000, 0, 0]);
        assert_eq!(decoded.sample[1].value, vec![200, 10000, 0, 0]);
        let labels: Vec<(&str, &str, i64)> = decoded.sample[0]
            .label
            .iter()
            .map(|l| (string(l.key), string(l.str), l.num))
            .collect();
        assert_eq!(
            labels,
            [
                ("pid", "", 42),
                ("command", "app", 0),
                ("cgroup", "/system.slice/app.service", 0)
            ]
        );
        // First stack: two locations, the first holding the inlined frame then its caller.
        let location = |id: u64| decoded.location.iter().find(|l| l.id == id).unwrap();
        let function = |id: u64| string(decoded.function.iter().find(|f| f.id == id).unwrap().name);
        let first = &decoded.sample[0].location_id;
        assert_eq!(first.len(), 2);
        let leaf = location(first[0]);
        assert_eq!(leaf.address, 0x110);
        let names: Vec<&str> = leaf.line.iter().map(|l| function(l.function_id)).collect();
        assert_eq!(names, vec!["inlined_leaf", "leaf"]);
        assert_eq!(leaf.line[0].line, 7);
        assert_eq!(function(location(first[1]).line[0].function_id), "main");
        let mapping = &decoded.mapping[0];
        assert_eq!(
            (string(mapping.filename), string(mapping.build_id)),
            ("/bin/app", "abcd")
        );
        assert!(mapping.has_functions);
    }

    #[test]
    fn folded_lines_are_root_first_with_chosen_values() {
        let profile = synthetic();
        let mut out = Vec::new();
        write(&profile, Format::Folded, Value::AllocObjects, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "/system.slice/app.service;app (42);main;leaf;inlined_leaf 100\n\
             /system.slice/app.service;app (42);main;other 200\n"
        );
        // Frees not tracked: in-use values are all zero, so no lines.
        assert!(folded::lines(&profile, Value::InuseBytes).is_empty());
    }

    #[test]
    fn svg_is_xml_naming_the_functions() {
        let profile = synthetic();
        let mut out = Vec::new();
        write(&profile, Format::Svg, Value::AllocBytes, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let xml = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        };
        let document = roxmltree::Document::parse_with_options(&text, xml).unwrap();
        let titles: Vec<&str> = document
            .descendants()
            .filter(|n| n.has_tag_name("title"))
            .filter_map(|n| n.text())
            .collect();
        assert!(
            titles.iter().any(|t| t.starts_with("inlined_leaf")),
            "{titles:?}"
        );
        assert!(text.contains("estimated bytes allocated"));
        // An empty graph is still valid XML.
        let mut empty = Vec::new();
        write(&profile, Format::Svg, Value::InuseBytes, &mut empty).unwrap();
        roxmltree::Document::parse_with_options(std::str::from_utf8(&empty).unwrap(), xml).unwrap();
    }

    #[test]
    fn formats_follow_extensions() {
        let of = |name: &str| Format::for_path(Path::new(name));
        assert_eq!(of("heap.pb.gz"), Ok(Format::Pprof));
        assert_eq!(of("x/heap.pprof"), Ok(Format::Pprof));
        assert_eq!(of("heap.folded"), Ok(Format::Folded));
        assert_eq!(of("heap.svg"), Ok(Format::Svg));
        assert_eq!(of("heap.json"), Ok(Format::Json));
        assert_eq!(of("heap"), Ok(Format::Json));
        assert_eq!(of("report.html"), Ok(Format::Html));
        assert_eq!(of("x.speedscope.json"), Ok(Format::Speedscope));
        let err = of("report.xhtml5").unwrap_err();
        assert!(
            err.contains("unknown extension .xhtml5") && err.contains(".html"),
            "{err}"
        );
    }
}
