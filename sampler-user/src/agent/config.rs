//! `allocscope agent`'s flags, checked: every mistake is said before anything is attached.

use std::{path::PathBuf, time::Duration};

use crate::{
    cli::AgentArgs,
    config::{duration_flag, parse_size, BadInput, SamplingConfig, Targets},
    export::Format,
};

use super::{backoff::Backoff, headers, pyroscope::Identity, sender::SenderConfig, sink::Sink};

/// A validated `agent` invocation.
pub struct AgentConfig {
    /// What to profile.
    pub targets: Targets,
    /// How to sample.
    pub sampling: SamplingConfig,
    /// Length of a period.
    pub period: Duration,
    /// What labels every profile.
    pub identity: Identity,
    /// The sending side.
    pub sender: SenderConfig,
    /// The files sink: directory, format, how many to keep.
    pub out_dir: Option<(PathBuf, Format, Option<usize>)>,
}

/// The sampling flags as the agent takes them: loaded into running processes only when
/// asked (a fleet agent leaves them as they are unless told otherwise).
fn agent_sampling(
    args: crate::cli::SamplingArgs,
) -> Result<crate::config::SamplingConfig, BadInput> {
    let asked = args.front_end.is_some();
    let mut sampling = args.into_config()?;
    if !asked {
        sampling.load_into_running = crate::config::LoadIntoRunning::Never;
    }
    Ok(sampling)
}

impl AgentArgs {
    /// Checks the flags.
    pub fn into_config(self) -> Result<AgentConfig, BadInput> {
        let targets = self.targets.into_targets()?;
        let sampling = agent_sampling(self.sampling)?;
        crate::config::front_end_fits(&targets, &sampling)?;
        if sampling.max_overhead.is_some() {
            return Err(BadInput(
                "--max-overhead is for one recording of -p or -- CMD, not the agent".into(),
            ));
        }
        let period = duration_flag("--period", &self.period, Duration::from_secs(1))?;
        let timeout = duration_flag(
            "--push-timeout",
            &self.push_timeout,
            Duration::from_millis(100),
        )?;
        let retry_max = duration_flag("--retry-max", &self.retry_max, Duration::from_secs(1))?;
        let flush = duration_flag("--flush-timeout", &self.flush_timeout, Duration::ZERO)?;
        let spool_bytes = parse_size(&self.spool_bytes).map_err(|why| {
            BadInput(format!(
                "invalid --spool-bytes {:?}: {why}",
                self.spool_bytes
            ))
        })?;
        let mut sinks = Vec::new();
        fn bad(flag: &'static str) -> impl Fn(String) -> BadInput {
            move |why| BadInput(format!("invalid {flag} {why}"))
        }
        for url in &self.pyroscope {
            sinks.push(Sink::pyroscope(url).map_err(bad("--pyroscope"))?);
        }
        for url in &self.otlp_http {
            sinks.push(Sink::otlp_http(url).map_err(bad("--otlp-http"))?);
        }
        for url in &self.otlp_grpc {
            sinks.push(Sink::otlp_grpc(url).map_err(bad("--otlp-grpc"))?);
        }
        if sinks.is_empty() && self.out_dir.is_none() {
            return Err(BadInput(
                "the agent needs somewhere to send profiles: --pyroscope, --otlp-http, \
                 --otlp-grpc or --out-dir"
                    .into(),
            ));
        }
        let labels = self
            .labels
            .iter()
            .map(|pair| label(pair))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(name) = &self.service_name {
            if name.trim().is_empty() || name.chars().any(char::is_control) {
                return Err(BadInput(format!("invalid --service-name {name:?}")));
            }
        }
        let headers = headers::load(self.headers_file.as_deref())?;
        let format = self.format.unwrap_or(Format::Json);
        Ok(AgentConfig {
            targets,
            sampling,
            period,
            identity: Identity {
                hostname: hostname(),
                service_name: self.service_name,
                labels,
            },
            sender: SenderConfig {
                sinks,
                headers,
                timeout,
                spool_dir: (!self.spool_in_memory).then_some(self.spool_dir),
                spool_bytes,
                status_file: self.status,
                flush,
                backoff: Backoff {
                    cap: retry_max,
                    ..Backoff::default()
                },
            },
            out_dir: self.out_dir.map(|dir| (dir, format, self.keep)),
        })
    }
}

/// `KEY=VALUE`, the key a Prometheus label name (Pyroscope's rule).
fn label(pair: &str) -> Result<(String, String), BadInput> {
    let bad = |why: &str| BadInput(format!("invalid --label {pair:?}: {why}"));
    let (key, value) = pair
        .split_once('=')
        .ok_or_else(|| bad("expected KEY=VALUE"))?;
    let mut chars = key.chars();
    let starts = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !starts || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') || key.starts_with("__") {
        return Err(bad(
            "the key must be [a-zA-Z_][a-zA-Z0-9_]* and not start with __",
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(bad("the value holds a control character"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// This host's name (`host.name`, `hostname`).
pub(crate) fn hostname() -> String {
    crate::sys::host::name().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_prometheus_names() {
        assert_eq!(label("env=prod").unwrap(), ("env".into(), "prod".into()));
        assert_eq!(label("a_1=x=y").unwrap(), ("a_1".into(), "x=y".into()));
        for bad in ["1a=x", "a-b=x", "=x", "__name__=x", "nokey"] {
            assert!(label(bad).is_err(), "{bad}");
        }
    }
}
