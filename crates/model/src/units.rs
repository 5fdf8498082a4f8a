//! Sizes and durations as a user types them on the command line (`64KiB`, `500ms`, `2d`):
//! parsed here, checked for range by the flags that take them (see sampler-user's `config`).

use std::time::Duration;

/// Parses a byte size: a whole number with an optional binary unit (`K`, `KiB`, `KB`, `M`,
/// `MiB`, `G`, `GiB`; case-insensitive, all powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| "expected a number of bytes, e.g. 65536 or 64KiB".to_owned())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(format!("unknown unit {other:?} (use B, KiB, MiB or GiB)")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| "too large".to_owned())
}

/// A whole size as a user would type it: `64KiB`, `2MiB`, `4096` (the largest binary unit
/// that divides it); [`parse_size`] reads it back.
pub fn size_flag(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Parses a duration: a number with an optional unit `ms`, `s` (default), `m` or `h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| "expected a number with an optional unit, e.g. 10s or 500ms".to_owned())?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        "d" => number * 86400.0,
        other => return Err(format!("unknown unit {other:?} (use ms, s, m, h or d)")),
    };
    if seconds.is_nan() || seconds <= 0.0 || seconds.is_infinite() {
        return Err("must be greater than zero".to_owned());
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2 GiB"), Ok(2 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("12parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("-5").is_err());
        assert!(parse_size("99999999999999G")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn sizes_are_written_as_they_are_read() {
        for (bytes, text) in [
            (65536, "64KiB"),
            (2 << 20, "2MiB"),
            (4096, "4KiB"),
            (1000, "1000"),
        ] {
            assert_eq!(size_flag(bytes), text);
            assert_eq!(parse_size(text), Ok(bytes));
        }
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(2 * 86400)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
