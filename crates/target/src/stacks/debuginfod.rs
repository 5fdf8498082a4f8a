//! Separate debug files from debuginfod servers, only when the user asks (`DEBUGINFOD_URLS`,
//! as for gdb and perf): offline by default.
//!
//! A file fetched for a build id goes to the debuginfod client cache every such tool shares
//! (`DEBUGINFOD_CACHE_PATH`, else `$XDG_CACHE_HOME/debuginfod_client`, else
//! `~/.cache/debuginfod_client`; `ID/debuginfo`), and is linked into a private build-id tree
//! (`.build-id/xx/rest.debug`, a temporary directory removed when allocscope exits) that the
//! symbolizer searches after the local debug directories: blazesym then finds it exactly as
//! it finds a distribution's `-dbgsym` package.
//!
//! A server is someone else's, and allocscope runs as root, so every fetch is bounded: a
//! request (connecting, then the whole body) has [`REQUEST_TIMEOUT`]; a body larger than
//! [`max_bytes`] of its module is cut off and dropped; only an ELF file that carries the
//! build id asked for is kept (written under a temporary name, then renamed into the cache);
//! a server that times out, fails or sends any of those is not asked again during the
//! recording. HTTP comes from the `debuginfod` crate's `reqwest` (blocking, rustls).

use std::{
    collections::HashSet,
    io::{Read as _, Write as _},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

/// The longest one request may take, connecting and reading its whole body.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes kept of a debug file for a module of `module_bytes`: 64 times the module
/// (DWARF is seldom 20 times its code), at least 64 MiB, at most 4 GiB.
pub(crate) fn max_bytes(module_bytes: u64) -> u64 {
    module_bytes.saturating_mul(64).clamp(64 << 20, 4 << 30)
}

/// One server of `DEBUGINFOD_URLS`.
#[derive(Debug)]
struct Server {
    url: String,
    /// It timed out, failed or sent something else than the file asked for.
    dropped: bool,
}

/// Fetches debug files by build id into a build-id tree.
pub(crate) struct Fetcher {
    http: debuginfod::reqwest::blocking::Client,
    servers: Vec<Server>,
    cache: PathBuf,
    tree: PathBuf,
    /// Local debug directories: a build id found there is not fetched.
    local: Vec<PathBuf>,
    tried: HashSet<String>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("servers", &self.servers)
            .field("tree", &self.tree)
            .finish()
    }
}

/// The servers of a `DEBUGINFOD_URLS` value (space-separated; empty: none). Pure.
pub(crate) fn servers_of(urls: &str) -> Vec<String> {
    urls.split_whitespace()
        .map(|url| url.trim_end_matches('/').to_owned())
        .filter(|url| !url.is_empty())
        .collect()
}

/// The shared debuginfod cache directory, from the environment as debuginfod clients read
/// it. Pure.
pub(crate) fn cache_dir(
    cache_path: Option<&str>,
    xdg_cache_home: Option<&str>,
    home: Option<&str>,
) -> Option<PathBuf> {
    let set = |v: Option<&str>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    set(cache_path)
        .or_else(|| set(xdg_cache_home).map(|d| d.join("debuginfod_client")))
        .or_else(|| set(home).map(|d| d.join(".cache").join("debuginfod_client")))
}

impl Fetcher {
    /// A fetcher for the servers in `DEBUGINFOD_URLS`, linking into `tree`; `None` when the
    /// variable is unset or empty. `local` are the directories searched before (not fetched
    /// for). Blocking: call it outside the async runtime (the symbolizer's thread).
    pub(crate) fn from_env(local: &[PathBuf], tree: &Path) -> anyhow::Result<Option<Fetcher>> {
        let servers = servers_of(&std::env::var("DEBUGINFOD_URLS").unwrap_or_default());
        if servers.is_empty() {
            return Ok(None);
        }
        let var = |name: &str| std::env::var(name).ok();
        let cache = cache_dir(
            var("DEBUGINFOD_CACHE_PATH").as_deref(),
            var("XDG_CACHE_HOME").as_deref(),
            var("HOME").as_deref(),
        )
        .context("no debuginfod cache directory (set DEBUGINFOD_CACHE_PATH)")?;
        let http = debuginfod::reqwest::blocking::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(REQUEST_TIMEOUT / 3)
            .build()
            .context("making the HTTP client")?;
        Ok(Some(Fetcher {
            http,
            servers: servers
                .into_iter()
                .map(|url| Server {
                    url,
                    dropped: false,
                })
                .collect(),
            cache,
            tree: tree.to_owned(),
            local: local.to_vec(),
            tried: HashSet::new(),
        }))
    }

    /// Makes the debug file of build id `hex` (of a module of `module_bytes`) available in
    /// the tree, fetching it unless a local directory has it; each build id is tried once.
    /// Failures are logged, not fatal: the frames keep their module and offset.
    pub(crate) fn ensure(&mut self, hex: &str, module_bytes: u64) {
        if hex.len() < 4
            || !hex.bytes().all(|b| b.is_ascii_hexdigit())
            || !self.tried.insert(hex.to_owned())
        {
            return;
        }
        let relative = build_id_path(hex);
        if self.local.iter().any(|dir| dir.join(&relative).exists()) {
            return;
        }
        let Some(found) = self.cached_or_fetched(hex, max_bytes(module_bytes)) else {
            return;
        };
        let link = self.tree.join(&relative);
        let linked = link
            .parent()
            .map(std::fs::create_dir_all)
            .transpose()
            .and_then(|_| std::os::unix::fs::symlink(&found, &link));
        if let Err(e) = linked {
            log::warn!("debuginfod: cannot link {}: {e}", found.display());
        }
    }

    /// The cached debug file of `hex`, else the first server's that sends a valid one.
    fn cached_or_fetched(&mut self, hex: &str, limit: u64) -> Option<PathBuf> {
        let dir = self.cache.join(hex);
        let cached = dir.join("debuginfo");
        if carries_build_id(&cached, hex) {
            return Some(cached);
        }
        for index in 0..self.servers.len() {
            if self.servers[index].dropped {
                continue;
            }
            let url = format!("{}/buildid/{hex}/debuginfo", self.servers[index].url);
            match self.fetch(&url, &dir, &cached, hex, limit) {
                Ok(true) => return Some(cached),
                Ok(false) => {}
                Err(e) => {
                    log::warn!(
                        "debuginfod: {}: {e:#}; not asked again during this recording",
                        crate::text::printable(&self.servers[index].url)
                    );
                    self.servers[index].dropped = true;
                }
            }
        }
        None
    }

    /// Fetches `url` into `cached`: `Ok(false)` when the server has no such file, an error
    /// when it failed or sent something else than a valid file.
    fn fetch(
        &self,
        url: &str,
        dir: &Path,
        cached: &Path,
        hex: &str,
        limit: u64,
    ) -> anyhow::Result<bool> {
        let response = self.http.get(url).send().context("no answer")?;
        if response.status() == debuginfod::reqwest::StatusCode::NOT_FOUND {
            log::info!("debuginfod: no debug file for build id {hex} at {url}");
            return Ok(false);
        }
        anyhow::ensure!(
            response.status().is_success(),
            "answered {}",
            response.status()
        );
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut file = tempfile::Builder::new()
            .prefix(".allocscope-")
            .tempfile_in(dir)
            .with_context(|| format!("a temporary file in {}", dir.display()))?;
        let mut body = response.take(limit + 1);
        let mut buffer = vec![0u8; 1 << 16];
        let mut total = 0u64;
        loop {
            let n = body.read(&mut buffer).context("reading the body")?;
            if n == 0 {
                break;
            }
            total += n as u64;
            anyhow::ensure!(
                total <= limit,
                "sent more than {} MiB for build id {hex}: dropped",
                limit >> 20
            );
            file.write_all(&buffer[..n]).context("writing the cache")?;
        }
        file.flush()?;
        anyhow::ensure!(
            carries_build_id(file.path(), hex),
            "sent a file that is not the debug file of build id {hex} ({total} bytes): dropped"
        );
        file.persist(cached)
            .map_err(|e| e.error)
            .with_context(|| format!("keeping {}", cached.display()))?;
        Ok(true)
    }
}

/// Whether `path` is a regular ELF file whose build id is `hex`.
fn carries_build_id(path: &Path, hex: &str) -> bool {
    use object::Object as _;
    let Ok(data) = crate::infile::map_regular(path) else {
        return false;
    };
    let Ok(elf) = object::File::parse(&*data) else {
        return false;
    };
    matches!(elf.build_id(), Ok(Some(id))
        if id.iter().map(|b| format!("{b:02x}")).collect::<String>() == hex)
}

/// Where a build id's debug file lives under a debug directory. Pure.
pub(crate) fn build_id_path(hex: &str) -> PathBuf {
    let (head, rest) = hex.split_at(2.min(hex.len()));
    Path::new(".build-id")
        .join(head)
        .join(format!("{rest}.debug"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_ids_split_after_their_first_byte() {
        assert_eq!(
            build_id_path("abcdef0123"),
            Path::new(".build-id/ab/cdef0123.debug")
        );
    }

    #[test]
    fn servers_cache_and_limits_come_from_the_environment_as_clients_read_it() {
        assert_eq!(
            servers_of(" http://a/  https://b:8002 "),
            ["http://a", "https://b:8002"]
        );
        assert!(servers_of("").is_empty());
        assert_eq!(
            cache_dir(Some("/c"), Some("/x"), Some("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            cache_dir(None, Some("/x"), Some("/h")),
            Some(PathBuf::from("/x/debuginfod_client"))
        );
        assert_eq!(
            cache_dir(Some(""), None, Some("/h")),
            Some(PathBuf::from("/h/.cache/debuginfod_client"))
        );
        assert_eq!(max_bytes(1000), 64 << 20);
        assert_eq!(max_bytes(10 << 20), 640 << 20);
        assert_eq!(max_bytes(1 << 40), 4 << 30);
    }
}
