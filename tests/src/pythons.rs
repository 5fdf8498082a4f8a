//! The Python interpreters the tests run, in one place: Debian's (`/usr/bin/python3`, 3.11)
//! and pyenv's under `/root/.pyenv` (3.11.7, 3.12.1, 3.13.0: the image this project's
//! machines run carries them; `cargo xtask setup` checks for 3.12 or 3.13 and installs
//! with `pyenv install` where pyenv is present).

use std::path::PathBuf;

/// Debian's interpreter.
pub const DEBIAN: &str = "/usr/bin/python3";

/// Debian's headers (3.11).
pub const DEBIAN_INCLUDE: &str = "/usr/include/python3.11";

/// Where pyenv keeps its versions.
const PYENV_VERSIONS: &str = "/root/.pyenv/versions";

/// pyenv's interpreter of `version` (`3.13.0` → `.../3.13.0/bin/python3.13`).
pub fn pyenv(version: &str) -> PathBuf {
    pyenv_root(version).join(format!("bin/python{}", minor(version)))
}

/// pyenv's headers of `version`.
pub fn pyenv_include(version: &str) -> PathBuf {
    pyenv_root(version).join(format!("include/python{}", minor(version)))
}

/// pyenv's shared libpython of `version` (built `--enable-shared`).
pub fn pyenv_libpython(version: &str) -> PathBuf {
    pyenv_root(version).join(format!("lib/libpython{}.so.1.0", minor(version)))
}

fn pyenv_root(version: &str) -> PathBuf {
    PathBuf::from(PYENV_VERSIONS).join(version)
}

/// `3.13` of `3.13.0`.
fn minor(version: &str) -> &str {
    version.rsplit_once('.').map_or(version, |(minor, _)| minor)
}

#[cfg(test)]
mod tests {
    #[test]
    fn paths_follow_pyenvs_layout() {
        assert_eq!(
            super::pyenv("3.13.0").to_str(),
            Some("/root/.pyenv/versions/3.13.0/bin/python3.13")
        );
        assert_eq!(
            super::pyenv_libpython("3.13.0").to_str(),
            Some("/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0")
        );
        assert_eq!(
            super::pyenv_include("3.11.7").to_str(),
            Some("/root/.pyenv/versions/3.11.7/include/python3.11")
        );
    }
}
