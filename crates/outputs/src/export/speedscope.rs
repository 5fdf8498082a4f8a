//! speedscope's file format (`https://www.speedscope.app/file-format-schema.json`): one
//! "sampled" profile per value (allocated bytes and objects, and in-use bytes and objects
//! where frees were tracked), each sample a stack root first with its estimate as weight,
//! over one shared frame table. speedscope shows a profile at a time and switches between
//! them, which is how a user switches value.
//!
//! speedscope has no place for bounds: the profile names say the values are estimates, and
//! the JSON export and the HTML report carry them.

use std::{collections::HashMap, io::Write};

use serde::Serialize;

use super::Value;
use crate::{
    format::{frame_name, sanitize},
    schema::Profile,
    stacks::symbolize::FrameKind,
};

/// The schema URL the format asks files to name.
pub(crate) const SCHEMA_URL: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File {
    #[serde(rename = "$schema")]
    schema: &'static str,
    name: String,
    exporter: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    shared: Shared,
    profiles: Vec<Sampled>,
}

#[derive(Serialize)]
struct Shared {
    frames: Vec<Frame>,
}

#[derive(Serialize, PartialEq, Eq, Hash, Clone)]
struct Frame {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

#[derive(Serialize)]
struct Sampled {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: f64,
    #[serde(rename = "endValue")]
    end_value: f64,
    samples: Vec<Vec<usize>>,
    weights: Vec<f64>,
}

/// The values written, in order (the in-use ones only where frees were tracked).
fn values(profile: &Profile) -> Vec<Value> {
    let mut values = vec![Value::AllocBytes, Value::AllocObjects];
    if !profile.alloc_only {
        values.extend([Value::InuseBytes, Value::InuseObjects]);
    }
    if profile.stacks.iter().any(|s| s.peak_bytes.is_some()) {
        values.extend([Value::PeakBytes, Value::PeakObjects]);
    }
    values
}

/// Writes `profile` as a speedscope file; `value` is the profile shown first.
pub(crate) fn write(profile: &Profile, value: Value, out: &mut dyn Write) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, &file(profile, value))?;
    writeln!(out)
}

fn file(profile: &Profile, first: Value) -> File {
    let labels = profile.process_labels();
    let mut frames: Vec<Frame> = Vec::new();
    let mut index: HashMap<Frame, usize> = HashMap::new();
    let mut intern = |frame: Frame| -> usize {
        *index.entry(frame.clone()).or_insert_with(|| {
            frames.push(frame);
            frames.len() - 1
        })
    };
    // Each stack root first: the process, then its frames from the outermost.
    let stacks: Vec<Vec<usize>> = profile
        .stacks
        .iter()
        .map(|stack| {
            let command = labels.get(&stack.pid).map_or("?", |(c, _)| *c);
            let mut path = vec![intern(Frame {
                name: sanitize(&format!("{command} ({})", stack.pid)),
                file: None,
            })];
            // One frame per function (its file beside it), as the folded stacks and the SVG
            // name them: a function called from two lines is one box, not two; a Python
            // frame's name carries its file and line already.
            path.extend(stack.frames.iter().rev().map(|f| {
                let python = f.kind == Some(FrameKind::Python);
                intern(Frame {
                    name: frame_name(f),
                    file: f.file.as_deref().filter(|_| !python).map(sanitize),
                })
            }));
            path
        })
        .collect();
    let values = values(profile);
    let profiles: Vec<Sampled> = values
        .iter()
        .map(|&value| {
            let (samples, weights): (Vec<Vec<usize>>, Vec<f64>) = profile
                .stacks
                .iter()
                .zip(&stacks)
                .map(|(stack, path)| (path.clone(), value.of(stack).round()))
                .filter(|(_, weight)| *weight > 0.0)
                .unzip();
            Sampled {
                kind: "sampled",
                name: format!("{} (allocscope)", value.describe()),
                unit: if value.is_bytes() { "bytes" } else { "none" },
                start_value: 0.0,
                end_value: weights.iter().sum(),
                samples,
                weights,
            }
        })
        .collect();
    let targets: Vec<String> = profile
        .processes
        .iter()
        .map(|p| sanitize(&format!("{} ({})", p.command, p.pid)))
        .collect();
    File {
        schema: SCHEMA_URL,
        name: format!("allocscope: {}", targets.join(", ")),
        exporter: format!("allocscope {}", env!("CARGO_PKG_VERSION")),
        active_profile_index: values.iter().position(|&v| v == first).unwrap_or(0),
        shared: Shared { frames },
        profiles,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_is_a_profile_over_one_frame_table_root_first() {
        let profile = allocscope_model::fixtures::synthetic();
        let mut out = Vec::new();
        write(&profile, Value::AllocObjects, &mut out).unwrap();
        let file: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(file["$schema"], SCHEMA_URL);
        // alloc-only: the allocated values only, the one asked for shown first.
        let profiles = file["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 2);
        assert_eq!(file["activeProfileIndex"], 1);
        let frames = file["shared"]["frames"].as_array().unwrap();
        let name = |i: &serde_json::Value| frames[i.as_u64().unwrap() as usize]["name"].clone();
        let bytes = &profiles[0];
        assert_eq!(bytes["unit"], "bytes");
        let first: Vec<_> = bytes["samples"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(name)
            .collect();
        assert_eq!(first, ["app (42)", "main", "leaf", "inlined_leaf"]);
        assert_eq!(bytes["weights"], serde_json::json!([20000.0, 10000.0]));
        assert_eq!(bytes["endValue"], 30000.0);
        assert_eq!(profiles[1]["unit"], "none");
        assert_eq!(profiles[1]["weights"], serde_json::json!([100.0, 200.0]));
        // `main` at two lines is one frame (as in the folded stacks); the process one.
        assert_eq!(frames.len(), 5, "{frames:?}");
        assert_eq!(frames[1]["file"], "/src/app.c");
    }
}
