//! Symbol names as people read them: C++ (`_Z…`) and Rust (`_R…`, and the legacy `_ZN…h
//! hash E`) manglings are demangled; every other name is kept as it is.
//!
//! A demangler asked about any string finds meaning in short ones: `cpp_demangle` reads a
//! C function named `f` as the type `float`, `i` as `int`, `St` as `std`. Only a name that
//! starts with a mangling's prefix is a mangled name.

/// `name`, demangled if it is a C++ or Rust mangled name.
pub(crate) fn demangle(name: &str) -> String {
    if name.starts_with("_R") || name.starts_with("_ZN") {
        if let Ok(rust) = rustc_demangle::try_demangle(name) {
            return format!("{rust:#}");
        }
    }
    if name.starts_with("_Z") {
        if let Some(cpp) = cpp_demangle::Symbol::new(name)
            .ok()
            .and_then(|s| s.demangle().ok())
        {
            return cpp;
        }
    }
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn only_mangled_names_are_demangled() {
        for plain in [
            "f",
            "i",
            "a",
            "b",
            "St",
            "Dn",
            "main",
            "malloc",
            "site_small",
        ] {
            assert_eq!(demangle(plain), plain);
        }
        assert_eq!(demangle("_Z1fv"), "f()");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        assert_eq!(
            demangle("_ZN4core9panicking9panic_fmt17h5f1a6fd39197ad62E"),
            "core::panicking::panic_fmt"
        );
        // Not a valid mangling after all: kept.
        assert_eq!(demangle("_Zfoo"), "_Zfoo");
    }
}
