//! `allocscope agent`: allocscope as a service feeding the stores fleets keep profiles in.
//!
//! The recording is `record`'s (same selectors, same sampling, same bounds); every period
//! its profile is cut per process (`period`), encoded for each sink (`pyroscope`, `otlp`,
//! both from the pprof message of `payload`), and handed to the sender thread (`sender`),
//! which spools (`spool`), delivers (`sink`) and retries with backoff (`backoff`) without
//! ever making the recording wait. `status` is what an operator reads; `headers` and
//! `config` are the flags. docs/agent.md has the receivers' setups.

pub(crate) mod backoff;
pub(crate) mod config;
pub(crate) mod headers;
pub(crate) mod otlp;
pub(crate) mod payload;
pub(crate) mod period;
pub(crate) mod pyroscope;
pub(crate) mod sender;
pub(crate) mod sink;
pub(crate) mod spool;
pub(crate) mod status;

use prost::Message as _;

use self::{period::ProcessPeriod, pyroscope::Identity, sink::Sink};

/// The request each sink gets for one period (same order as `sinks`).
pub(crate) fn encode(
    sinks: &[Sink],
    periods: &[ProcessPeriod],
    identity: &Identity,
    start_unix_ns: i64,
) -> Vec<Vec<u8>> {
    let mut pyroscope = None;
    let mut otlp = None;
    sinks
        .iter()
        .map(|sink| match sink {
            Sink::Pyroscope(_) => pyroscope
                .get_or_insert_with(|| pyroscope::push_request(periods, identity, start_unix_ns))
                .clone(),
            Sink::OtlpHttp(_) | Sink::OtlpGrpc(_) => otlp
                .get_or_insert_with(|| {
                    otlp::export_request(periods, identity, start_unix_ns).encode_to_vec()
                })
                .clone(),
        })
        .collect()
}
