//! Grafana Pyroscope's push API: `push.v1.PusherService/Push`, a protobuf `PushRequest` over
//! HTTP (the Connect protocol's unary call: `POST`, `Content-Type: application/proto`).
//!
//! One series per process. Its labels name the profile type and the process:
//! `__name__="memory"` with the payload's Go heap sample types makes Pyroscope show
//! `memory:alloc_space:bytes:space:bytes` and the in-use types; `__delta__="false"` says the
//! values are already per period (without it Pyroscope subtracts successive allocation
//! profiles, as it does for Go's cumulative ones); `service_name` (the command unless
//! configured), `pid`, `command`, `hostname`, and `container_id`/`cgroup` when known, let a
//! query pick a host, a service or a container. Label names follow Prometheus's rule
//! (`[a-zA-Z_][a-zA-Z0-9_]*`), checked where the user gives them (`config`).

use prost::Message;

use super::{payload, period::ProcessPeriod};

/// `push.v1` and `types.v1` messages, field numbers as Grafana publishes them
/// (grafana/pyroscope `api/push/v1/push.proto`, `api/types/v1/types.proto`).
pub(crate) mod proto {
    #![allow(missing_docs)]

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct PushRequest {
        #[prost(message, repeated, tag = "1")]
        pub series: Vec<RawProfileSeries>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct RawProfileSeries {
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<LabelPair>,
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<RawSample>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct RawSample {
        #[prost(bytes = "vec", tag = "1")]
        pub raw_profile: Vec<u8>,
        #[prost(string, tag = "2")]
        pub id: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct LabelPair {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }
}

/// The path of the push call under the server's URL.
pub(crate) const PUSH_PATH: &str = "push.v1.PusherService/Push";

/// What every series of this agent is labelled with besides its process.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    /// This host's name.
    pub hostname: String,
    /// `service_name` of every series (default: each process's command).
    pub service_name: Option<String>,
    /// Extra labels (`--label`), already checked.
    pub labels: Vec<(String, String)>,
}

/// The encoded `PushRequest` of one period: a series per process. `start_unix_ns`: when
/// the period started.
pub(crate) fn push_request(
    periods: &[ProcessPeriod],
    identity: &Identity,
    start_unix_ns: i64,
) -> Vec<u8> {
    let series = periods
        .iter()
        .map(|period| {
            let message = payload::bounded(period, start_unix_ns);
            proto::RawProfileSeries {
                labels: labels(period, identity),
                samples: vec![proto::RawSample {
                    raw_profile: gzipped(&message.encode_to_vec()),
                    id: random_uuid(),
                }],
            }
        })
        .collect();
    proto::PushRequest { series }.encode_to_vec()
}

/// A series' labels, sorted by name (as Pyroscope keeps them).
fn labels(period: &ProcessPeriod, identity: &Identity) -> Vec<proto::LabelPair> {
    let mut labels: Vec<(String, String)> = vec![
        ("__name__".into(), "memory".into()),
        ("__delta__".into(), "false".into()),
        (
            "service_name".into(),
            identity
                .service_name
                .clone()
                .unwrap_or_else(|| period.command.clone()),
        ),
        ("pid".into(), period.pid.to_string()),
        ("command".into(), period.command.clone()),
        ("hostname".into(), identity.hostname.clone()),
        ("front_end".into(), period.front_end.clone()),
    ];
    if let Some(cgroup) = &period.cgroup {
        labels.push(("cgroup".into(), cgroup.clone()));
    }
    if let Some(id) = &period.container_id {
        labels.push(("container_id".into(), id.clone()));
    }
    for (name, value) in &identity.labels {
        match labels.iter_mut().find(|(n, _)| n == name) {
            Some(existing) => existing.1 = value.clone(),
            None => labels.push((name.clone(), value.clone())),
        }
    }
    labels.sort();
    labels
        .into_iter()
        .map(|(name, value)| proto::LabelPair { name, value })
        .collect()
}

fn gzipped(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = gzip.write_all(bytes);
    gzip.finish().unwrap_or_default()
}

/// A version-4 UUID from the kernel's random bytes (each profile's id).
pub(crate) fn random_uuid() -> String {
    let mut bytes = random_bytes();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// 16 random bytes from the kernel (profile ids).
pub(crate) fn random_bytes() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the buffer it is given.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        // Unique enough without the kernel's randomness: the time and our pid.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes = (now ^ (u128::from(std::process::id()) << 96)).to_le_bytes();
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::period::split;
    use allocscope_model::fixtures::synthetic;

    #[test]
    fn a_series_per_process_labelled_for_pyroscope() {
        let profile = synthetic();
        let periods = split(&profile, 60.0);
        let identity = Identity {
            hostname: "host-1".into(),
            service_name: None,
            labels: vec![("env".into(), "prod".into())],
        };
        let bytes = push_request(&periods, &identity, 5);
        let request = proto::PushRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(request.series.len(), 1);
        let series = &request.series[0];
        let label = |name: &str| {
            series
                .labels
                .iter()
                .find(|l| l.name == name)
                .map(|l| l.value.as_str())
        };
        assert_eq!(label("__name__"), Some("memory"));
        assert_eq!(label("__delta__"), Some("false"));
        assert_eq!(label("service_name"), Some("app"));
        assert_eq!(label("pid"), Some("42"));
        assert_eq!(label("hostname"), Some("host-1"));
        assert_eq!(label("cgroup"), Some("/system.slice/app.service"));
        assert_eq!(label("env"), Some("prod"));
        let names: Vec<_> = series.labels.iter().map(|l| l.name.clone()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        let pprof = crate::export::pprof::read(&series.samples[0].raw_profile).unwrap();
        assert_eq!(pprof.time_nanos, 5);
        let types: Vec<_> = pprof
            .sample_type
            .iter()
            .map(|t| pprof.string_table[t.r#type as usize].as_str())
            .collect();
        assert_eq!(
            types,
            [
                "alloc_objects",
                "alloc_space",
                "inuse_objects",
                "inuse_space"
            ]
        );
    }

    #[test]
    fn a_configured_service_name_wins() {
        let periods = split(&synthetic(), 1.0);
        let identity = Identity {
            service_name: Some("checkout".into()),
            ..Identity::default()
        };
        let labels = labels(&periods[0], &identity);
        assert!(labels
            .iter()
            .any(|l| l.name == "service_name" && l.value == "checkout"));
    }

    #[test]
    fn uuids_are_version_4_and_differ() {
        let (a, b) = (random_uuid(), random_uuid());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"));
    }
}
