//! OpenTelemetry profiles (`opentelemetry.proto.collector.profiles.v1development`): the
//! `ExportProfilesServiceRequest` of one period, converted from the pprof message each
//! process's period already has (`payload::bounded`).
//!
//! One `ResourceProfiles` per process (attributes `host.name`, `process.pid`,
//! `process.executable.name`/`.path`, `service.name`, `container.id` when the cgroup names
//! one), one profile per sample type (this version of the format has one `sample_type` per
//! profile), all sharing the request's dictionary. Every table of the dictionary starts
//! with its zero entry (empty string, empty mapping, …): the format reserves index 0 as
//! "none", and receivers such as Parca's normalizer reject a request without it. The bounds
//! travel as sample attributes `allocscope.<type>.lower`/`.upper` (unit bytes).

use std::collections::HashMap;

use opentelemetry_proto::tonic::{
    collector::profiles::v1development::ExportProfilesServiceRequest,
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    profiles::v1development::{
        Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
        ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
    },
    resource::v1::Resource,
};

use super::{payload, period::ProcessPeriod, pyroscope::Identity};
use crate::export::pprof::proto as pprof;

/// The request for one period that started at `start_unix_ns`.
pub(crate) fn export_request(
    periods: &[ProcessPeriod],
    identity: &Identity,
    start_unix_ns: i64,
) -> ExportProfilesServiceRequest {
    let mut dictionary = Dictionary::new();
    let resource_profiles = periods
        .iter()
        .map(|period| {
            let message = payload::bounded(period, start_unix_ns);
            let profiles = dictionary.profiles(&message, period);
            ResourceProfiles {
                resource: Some(Resource {
                    attributes: resource_attributes(period, identity),
                    ..Default::default()
                }),
                scope_profiles: vec![ScopeProfiles {
                    scope: Some(InstrumentationScope {
                        name: "allocscope".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    profiles,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dictionary.table),
    }
}

fn text(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn resource_attributes(period: &ProcessPeriod, identity: &Identity) -> Vec<KeyValue> {
    let name = period
        .executable
        .rsplit('/')
        .next()
        .unwrap_or(&period.executable);
    let mut attributes = vec![
        text("host.name", identity.hostname.clone()),
        KeyValue {
            key: "process.pid".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::IntValue(i64::from(period.pid))),
            }),
            ..Default::default()
        },
        text("process.executable.name", name),
        text("process.executable.path", period.executable.clone()),
        text("process.command", period.command.clone()),
        text(
            "service.name",
            identity
                .service_name
                .clone()
                .unwrap_or_else(|| period.command.clone()),
        ),
        text("allocscope.front_end", period.front_end.clone()),
    ];
    if let Some(id) = &period.container_id {
        attributes.push(text("container.id", id.clone()));
    }
    if let Some(cgroup) = &period.cgroup {
        attributes.push(text("allocscope.cgroup", cgroup.clone()));
    }
    for (key, value) in &identity.labels {
        attributes.push(text(key, value.clone()));
    }
    attributes
}

/// The request's shared tables, each deduplicated, each with its zero entry first.
struct Dictionary {
    table: ProfilesDictionary,
    strings: HashMap<String, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, i64, i32), i32>,
}

impl Dictionary {
    fn new() -> Dictionary {
        let mut dictionary = Dictionary {
            table: ProfilesDictionary {
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                link_table: vec![Link::default()],
                string_table: Vec::new(),
                attribute_table: vec![KeyValueAndUnit::default()],
                stack_table: vec![Stack::default()],
            },
            strings: HashMap::new(),
            stacks: HashMap::new(),
            attributes: HashMap::new(),
        };
        dictionary.string("");
        dictionary
    }

    fn string(&mut self, text: &str) -> i32 {
        if let Some(&i) = self.strings.get(text) {
            return i;
        }
        let i = self.table.string_table.len() as i32;
        self.table.string_table.push(text.to_owned());
        self.strings.insert(text.to_owned(), i);
        i
    }

    /// A numeric attribute `key` = `value` with `unit` (a string index).
    fn number(&mut self, key: &str, value: i64, unit: i32) -> i32 {
        let key = self.string(key);
        let entry = (key, value, unit);
        if let Some(&i) = self.attributes.get(&entry) {
            return i;
        }
        let i = self.table.attribute_table.len() as i32;
        self.table.attribute_table.push(KeyValueAndUnit {
            key_strindex: key,
            value: Some(AnyValue {
                value: Some(any_value::Value::IntValue(value)),
            }),
            unit_strindex: unit,
        });
        self.attributes.insert(entry, i);
        i
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = self.table.stack_table.len() as i32;
        self.table.stack_table.push(Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }

    /// The profiles (one per sample type) of one process's pprof `message`; its mappings,
    /// functions and locations are added to the tables.
    fn profiles(&mut self, message: &pprof::Profile, period: &ProcessPeriod) -> Vec<Profile> {
        let strings = &message.string_table;
        let at = |i: i64| strings.get(i as usize).map_or("", String::as_str);
        let locations = self.locations(message);
        let bytes = self.string("bytes");
        let period_type = ValueType {
            type_strindex: self.string(at(message.period_type.as_ref().map_or(0, |t| t.r#type))),
            unit_strindex: self.string(at(message.period_type.as_ref().map_or(0, |t| t.unit))),
        };
        let stacks: Vec<i32> = message
            .sample
            .iter()
            .map(|sample| {
                let ids = sample
                    .location_id
                    .iter()
                    .map(|id| locations.get(id).copied().unwrap_or(0))
                    .collect();
                self.stack(ids)
            })
            .collect();
        let profile_attributes = vec![self.number(
            "allocscope.confidence_percent",
            (period.profile.sampling.confidence * 100.0).round() as i64,
            0,
        )];
        let mut profiles = Vec::new();
        for (column, kind) in message.sample_type.iter().enumerate() {
            let kind_name = at(kind.r#type).to_owned();
            let mut samples = Vec::new();
            for (sample, &stack_index) in message.sample.iter().zip(&stacks) {
                let value = sample.value.get(column).copied().unwrap_or(0);
                if value == 0 {
                    continue;
                }
                let attribute_indices = self.bounds_of(message, sample, &kind_name, bytes);
                samples.push(Sample {
                    stack_index,
                    attribute_indices,
                    link_index: 0,
                    values: vec![value],
                    timestamps_unix_nano: Vec::new(),
                });
            }
            if samples.is_empty() {
                continue;
            }
            profiles.push(Profile {
                sample_type: Some(ValueType {
                    type_strindex: self.string(&kind_name),
                    unit_strindex: self.string(at(kind.unit)),
                }),
                samples,
                time_unix_nano: message.time_nanos.max(0) as u64,
                duration_nano: message.duration_nanos.max(0) as u64,
                period_type: Some(period_type),
                period: message.period,
                profile_id: super::pyroscope::random_bytes().to_vec(),
                attribute_indices: profile_attributes.clone(),
                ..Default::default()
            });
        }
        profiles
    }

    /// Adds `message`'s mappings, functions and locations to the tables; returns where
    /// each of its location ids went.
    fn locations(&mut self, message: &pprof::Profile) -> HashMap<u64, i32> {
        let strings = &message.string_table;
        let at = |i: i64| strings.get(i as usize).map_or("", String::as_str);
        let mut mappings = HashMap::new();
        for mapping in &message.mapping {
            let index = self.table.mapping_table.len() as i32;
            let filename_strindex = self.string(at(mapping.filename));
            self.table.mapping_table.push(Mapping {
                memory_start: mapping.memory_start,
                memory_limit: mapping.memory_limit,
                file_offset: mapping.file_offset,
                filename_strindex,
                attribute_indices: Vec::new(),
            });
            mappings.insert(mapping.id, index);
        }
        let mut functions = HashMap::new();
        for function in &message.function {
            let index = self.table.function_table.len() as i32;
            let entry = Function {
                name_strindex: self.string(at(function.name)),
                system_name_strindex: self.string(at(function.system_name)),
                filename_strindex: self.string(at(function.filename)),
                start_line: function.start_line,
            };
            self.table.function_table.push(entry);
            functions.insert(function.id, index);
        }
        let mut locations = HashMap::new();
        for location in &message.location {
            let index = self.table.location_table.len() as i32;
            let lines = location
                .line
                .iter()
                .map(|line| Line {
                    function_index: functions.get(&line.function_id).copied().unwrap_or(0),
                    line: line.line,
                    column: line.column,
                })
                .collect();
            self.table.location_table.push(Location {
                mapping_index: mappings.get(&location.mapping_id).copied().unwrap_or(0),
                address: location.address,
                lines,
                attribute_indices: Vec::new(),
            });
            locations.insert(location.id, index);
        }
        locations
    }

    /// The bound attributes of `sample` that belong to the sample type `kind`
    /// (`alloc_space` gets `allocscope.alloc_space.lower`/`.upper`).
    fn bounds_of(
        &mut self,
        message: &pprof::Profile,
        sample: &pprof::Sample,
        kind: &str,
        bytes: i32,
    ) -> Vec<i32> {
        let mut indices = Vec::new();
        for label in &sample.label {
            let key = message
                .string_table
                .get(label.key as usize)
                .map_or("", String::as_str);
            let Some(which) = key
                .strip_prefix(kind)
                .and_then(|rest| rest.strip_prefix('_'))
            else {
                continue;
            };
            if payload::BOUND_LABELS.contains(&key) {
                indices.push(self.number(&format!("allocscope.{kind}.{which}"), label.num, bytes));
            }
        }
        indices
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::period::split;
    use allocscope_model::fixtures::synthetic;

    fn request() -> ExportProfilesServiceRequest {
        let mut profile = synthetic();
        let mut other = profile.processes[0].clone();
        other.pid = 7;
        profile.processes.push(other);
        let mut stack = profile.stacks[0].clone();
        stack.pid = 7;
        profile.stacks.push(stack);
        let identity = Identity {
            hostname: "h".into(),
            ..Identity::default()
        };
        export_request(&split(&profile, 60.0), &identity, 1_000)
    }

    #[test]
    fn every_table_starts_with_its_zero_entry() {
        let dictionary = request().dictionary.unwrap();
        assert_eq!(dictionary.string_table[0], "");
        assert_eq!(dictionary.mapping_table[0], Mapping::default());
        assert_eq!(dictionary.location_table[0], Location::default());
        assert_eq!(dictionary.function_table[0], Function::default());
        assert_eq!(dictionary.link_table[0], Link::default());
        assert_eq!(dictionary.attribute_table[0], KeyValueAndUnit::default());
        assert_eq!(dictionary.stack_table[0], Stack::default());
        assert!(dictionary.function_table.len() > 1);
        assert!(dictionary.location_table.len() > 1);
    }

    #[test]
    fn a_resource_per_process_and_a_profile_per_type_with_values() {
        let request = request();
        assert_eq!(request.resource_profiles.len(), 2);
        let dictionary = request.dictionary.as_ref().unwrap();
        let s = |i: i32| dictionary.string_table[i as usize].as_str();
        for resource in &request.resource_profiles {
            let attributes = &resource.resource.as_ref().unwrap().attributes;
            assert!(attributes.iter().any(|a| a.key == "process.pid"));
            assert!(attributes.iter().any(|a| a.key == "host.name"));
            let profiles = &resource.scope_profiles[0].profiles;
            // alloc_only: only the allocation types have values.
            let types: Vec<_> = profiles
                .iter()
                .map(|p| s(p.sample_type.unwrap().type_strindex))
                .collect();
            assert_eq!(types, ["alloc_objects", "alloc_space"]);
            for profile in profiles {
                assert_eq!(profile.profile_id.len(), 16);
                assert_eq!(profile.time_unix_nano, 1_000);
                for sample in &profile.samples {
                    assert!(sample.stack_index > 0);
                    let stack = &dictionary.stack_table[sample.stack_index as usize];
                    assert!(stack.location_indices.iter().all(|&l| l > 0));
                }
            }
            let space = &profiles[1];
            let keys: Vec<_> = space.samples[0]
                .attribute_indices
                .iter()
                .map(|&i| s(dictionary.attribute_table[i as usize].key_strindex))
                .collect();
            assert_eq!(
                keys,
                [
                    "allocscope.alloc_space.lower",
                    "allocscope.alloc_space.upper"
                ]
            );
            assert!(profiles[0].samples[0].attribute_indices.is_empty());
        }
    }
}
