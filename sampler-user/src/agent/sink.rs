//! Where the agent's periods go, and how one request is delivered there.
//!
//! A delivery either succeeds, fails in a way worth trying again (the store is down,
//! overloaded, slow: connection errors, timeouts, HTTP 408/429/5xx, gRPC UNAVAILABLE and
//! kin), or is refused for good (HTTP 4xx, gRPC INVALID_ARGUMENT…): trying again would
//! only repeat the refusal, so the request is dropped and counted, and the reason logged.

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    profiles_service_client::ProfilesServiceClient, ExportProfilesServiceRequest,
};
use prost::Message as _;

use super::headers::Headers;

/// A sink as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    /// Pyroscope's push API at this base URL.
    Pyroscope(String),
    /// OTLP over HTTP (protobuf) to this URL.
    OtlpHttp(String),
    /// OTLP over gRPC to this endpoint.
    OtlpGrpc(String),
}

/// OTLP/HTTP's path for profiles when the URL gives none.
pub(crate) const OTLP_HTTP_PATH: &str = "/v1development/profiles";

impl Sink {
    /// `--pyroscope URL`.
    pub fn pyroscope(url: &str) -> Result<Sink, String> {
        Ok(Sink::Pyroscope(
            http_url(url)?.trim_end_matches('/').to_owned(),
        ))
    }

    /// `--otlp-http URL`: the OTLP endpoint (`http://collector:4318`) or the full URL.
    pub fn otlp_http(url: &str) -> Result<Sink, String> {
        let url = http_url(url)?;
        let after_scheme = url.split_once("://").map_or("", |(_, rest)| rest);
        let has_path = after_scheme
            .split_once('/')
            .is_some_and(|(_, p)| !p.is_empty());
        Ok(Sink::OtlpHttp(if has_path {
            url.to_owned()
        } else {
            format!("{}{OTLP_HTTP_PATH}", url.trim_end_matches('/'))
        }))
    }

    /// `--otlp-grpc URL`: `http://collector:4317` (plaintext) or `https://…` (TLS).
    pub fn otlp_grpc(url: &str) -> Result<Sink, String> {
        Ok(Sink::OtlpGrpc(
            http_url(url)?.trim_end_matches('/').to_owned(),
        ))
    }

    /// What it is, for messages and the status file.
    pub fn describe(&self) -> String {
        match self {
            Sink::Pyroscope(url) => format!("pyroscope {url}"),
            Sink::OtlpHttp(url) => format!("otlp-http {url}"),
            Sink::OtlpGrpc(url) => format!("otlp-grpc {url}"),
        }
    }

    /// The name of its spool directory: stable across restarts, one per sink.
    pub fn spool_name(&self) -> String {
        let text = self.describe();
        // FNV-1a: stable across builds (std's hasher is not).
        let hash = text.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
        let kind = text.split(' ').next().unwrap_or("sink");
        format!("{kind}-{hash:016x}")
    }
}

/// The start of an error response's body, for the log: at most [`ERROR_BODY_BYTES`] are
/// read (a sink answering 500 with gigabytes made the agent hold them all).
async fn error_body(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(ERROR_BODY_BYTES);
    let text = String::from_utf8_lossy(&body);
    crate::text::printable(&text).chars().take(300).collect()
}

/// Bytes of an error response's body read at most.
const ERROR_BODY_BYTES: usize = 4096;

fn http_url(url: &str) -> Result<&str, String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?}: expected an http:// or https:// URL"))?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{url:?}: not a URL"));
    }
    Ok(url)
}

/// Why a delivery failed.
#[derive(Debug)]
pub(crate) struct Failure {
    /// Worth trying again later.
    pub retry: bool,
    /// What happened.
    pub message: String,
}

/// Delivers requests: one HTTP client (rustls, the system's roots) and, per gRPC sink, a
/// channel made on first use.
pub(crate) struct Transport {
    http: reqwest::Client,
    headers: Headers,
    timeout: Duration,
    grpc: Vec<(String, ProfilesServiceClient<tonic::transport::Channel>)>,
}

impl Transport {
    /// A transport sending `headers` with every request, each given `timeout`.
    pub(crate) fn new(headers: Headers, timeout: Duration) -> anyhow::Result<Transport> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // A redirect is not followed: it would carry the headers (API keys, tenant) to
            // wherever the sink points, and a 3xx is not a delivery.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("allocscope/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("setting up the HTTP client")?;
        Ok(Transport {
            http,
            headers,
            timeout,
            grpc: Vec::new(),
        })
    }

    /// Delivers one encoded request to `sink`.
    pub(crate) async fn deliver(&mut self, sink: &Sink, request: &[u8]) -> Result<(), Failure> {
        match sink {
            Sink::Pyroscope(base) => {
                let url = format!("{base}/{}", super::pyroscope::PUSH_PATH);
                self.post(&url, "application/proto", request).await
            }
            Sink::OtlpHttp(url) => self.post(url, "application/x-protobuf", request).await,
            Sink::OtlpGrpc(url) => self.export_grpc(url, request).await,
        }
    }

    async fn post(&self, url: &str, content_type: &str, body: &[u8]) -> Result<(), Failure> {
        let mut request = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body.to_vec());
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let response = request.send().await.map_err(|e| Failure {
            retry: true,
            message: format!("{e}{}", source_chain(&e)),
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        if status.is_redirection() {
            let to = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(crate::text::printable)
                .unwrap_or_default();
            return Err(Failure {
                retry: false,
                message: format!("HTTP {status} to {to:?}: redirects are not followed (give the sink's final URL)"),
            });
        }
        let text = error_body(response).await;
        Err(Failure {
            retry: status.is_server_error() || matches!(status.as_u16(), 408 | 429),
            message: format!("HTTP {status}: {text}"),
        })
    }

    async fn export_grpc(&mut self, url: &str, body: &[u8]) -> Result<(), Failure> {
        let permanent = |message: String| Failure {
            retry: false,
            message,
        };
        let message = ExportProfilesServiceRequest::decode(body)
            .map_err(|e| permanent(format!("a spooled request does not decode: {e}")))?;
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        for (name, value) in &self.headers {
            let name =
                tonic::metadata::MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes());
            if let (Ok(name), Ok(value)) = (name, value.parse()) {
                request.metadata_mut().insert(name, value);
            }
        }
        let client = self
            .grpc_client(url)
            .map_err(|e| permanent(format!("{e:#}")))?;
        match client.export(request).await {
            Ok(response) => {
                if let Some(partial) = response.into_inner().partial_success {
                    if partial.rejected_profiles > 0 {
                        log::warn!(
                            "{url} rejected {} profiles: {}",
                            partial.rejected_profiles,
                            crate::text::printable(&partial.error_message)
                        );
                    }
                }
                Ok(())
            }
            Err(status) => {
                use tonic::Code;
                Err(Failure {
                    retry: matches!(
                        status.code(),
                        Code::Unavailable
                            | Code::DeadlineExceeded
                            | Code::ResourceExhausted
                            | Code::Aborted
                            | Code::Cancelled
                            | Code::Unknown
                            | Code::Internal
                    ),
                    message: format!(
                        "gRPC {:?}: {}",
                        status.code(),
                        crate::text::printable(status.message())
                    ),
                })
            }
        }
    }

    fn grpc_client(
        &mut self,
        url: &str,
    ) -> anyhow::Result<&mut ProfilesServiceClient<tonic::transport::Channel>> {
        if let Some(i) = self.grpc.iter().position(|(u, _)| u == url) {
            return Ok(&mut self.grpc[i].1);
        }
        let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
            .with_context(|| format!("{url}: not a gRPC endpoint"))?
            .connect_timeout(self.timeout)
            .timeout(self.timeout);
        if url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(tonic::transport::ClientTlsConfig::new().with_native_roots())
                .context("setting up TLS")?;
        }
        let channel = endpoint.connect_lazy();
        self.grpc
            .push((url.to_owned(), ProfilesServiceClient::new(channel)));
        Ok(&mut self.grpc.last_mut().expect("just pushed").1)
    }
}

/// The causes of an error, `: cause: cause` (reqwest's own message is terse).
fn source_chain(error: &dyn std::error::Error) -> String {
    let mut text = String::new();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_http_gets_the_profiles_path_when_none_is_given() {
        assert_eq!(
            Sink::otlp_http("http://c:4318").unwrap(),
            Sink::OtlpHttp("http://c:4318/v1development/profiles".into())
        );
        assert_eq!(
            Sink::otlp_http("https://c/custom/path").unwrap(),
            Sink::OtlpHttp("https://c/custom/path".into())
        );
        assert!(Sink::otlp_http("c:4318").is_err());
        assert!(Sink::pyroscope("http://").is_err());
        assert!(Sink::pyroscope("http://a b").is_err());
    }

    #[test]
    fn spool_names_are_stable_and_distinct() {
        let a = Sink::pyroscope("http://p:4040").unwrap();
        let b = Sink::pyroscope("http://q:4040").unwrap();
        assert_eq!(a.spool_name(), a.clone().spool_name());
        assert_ne!(a.spool_name(), b.spool_name());
        assert!(a.spool_name().starts_with("pyroscope-"));
    }
}
