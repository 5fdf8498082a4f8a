//! Separate debug files from debuginfod servers, only when the user asks (`DEBUGINFOD_URLS`,
//! as for gdb and perf): offline by default.
//!
//! A file fetched for a build id goes to the debuginfod client cache every such tool shares
//! (`DEBUGINFOD_CACHE_PATH`, else `~/.cache/debuginfod_client`), and is linked into a
//! private build-id tree (`.build-id/xx/rest.debug`, a fresh temporary directory of ours)
//! that the symbolizer searches after the local debug directories: blazesym then finds it
//! exactly as it finds a distribution's `-dbgsym` package.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use anyhow::Context as _;

/// Fetches debug files by build id into a build-id tree.
pub struct Fetcher {
    client: debuginfod::CachingClient,
    tree: tempfile::TempDir,
    /// Local debug directories: a build id found there is not fetched.
    local: Vec<PathBuf>,
    tried: HashSet<String>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("tree", &self.tree.path())
            .finish()
    }
}

impl Fetcher {
    /// A fetcher for the servers in `DEBUGINFOD_URLS`; `None` when it is unset or empty.
    /// `local` are the directories searched before (not fetched for). Blocking: call it
    /// outside the async runtime (the symbolizer's thread).
    pub fn from_env(local: &[PathBuf]) -> anyhow::Result<Option<Fetcher>> {
        let Some(client) = debuginfod::Client::builder()
            .http_client(debuginfod::reqwest::blocking::Client::new())
            .build_from_env()
            .context("reading DEBUGINFOD_URLS")?
        else {
            return Ok(None);
        };
        let client = debuginfod::CachingClient::from_env(client)
            .context("opening the debuginfod cache (DEBUGINFOD_CACHE_PATH)")?;
        let tree = tempfile::Builder::new()
            .prefix("allocscope-debuginfod-")
            .tempdir()
            .context("creating the build-id tree for fetched debug files")?;
        Ok(Some(Fetcher {
            client,
            tree,
            local: local.to_vec(),
            tried: HashSet::new(),
        }))
    }

    /// The build-id tree to search (after the local directories).
    pub fn tree(&self) -> &Path {
        self.tree.path()
    }

    /// Makes the debug file of build id `hex` available in the tree, fetching it unless a
    /// local directory has it; each build id is tried once. Failures are logged, not fatal:
    /// the frames keep their module and offset.
    pub fn ensure(&mut self, hex: &str) {
        if hex.len() < 4 || !self.tried.insert(hex.to_owned()) {
            return;
        }
        let relative = build_id_path(hex);
        if self.local.iter().any(|dir| dir.join(&relative).exists()) {
            return;
        }
        let id = debuginfod::BuildId::formatted(hex.to_owned());
        match self.client.fetch_debug_info(&id) {
            Ok(Some(fetched)) => {
                let link = self.tree.path().join(&relative);
                let linked = link
                    .parent()
                    .map(std::fs::create_dir_all)
                    .transpose()
                    .and_then(|_| std::os::unix::fs::symlink(&fetched, &link));
                if let Err(e) = linked {
                    log::warn!("debuginfod: cannot link {}: {e}", fetched.display());
                }
            }
            Ok(None) => log::info!("debuginfod: no debug file for build id {hex}"),
            Err(e) => log::warn!("debuginfod: fetching build id {hex}: {e:#}"),
        }
    }
}

/// Where a build id's debug file lives under a debug directory. Pure.
pub fn build_id_path(hex: &str) -> PathBuf {
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
}
