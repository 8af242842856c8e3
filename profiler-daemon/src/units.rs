//! Human units on the command line and in the config: durations such as `10s`, `500ms`, `2m`
//! and byte sizes such as `512KiB`, `1GiB`, plus the inverse formatting used in messages.
//! Parsing and formatting only: which values are allowed where is the caller's business.

use std::time::Duration;

/// Parses a duration written as a number and a unit (`ns`, `us`, `ms`, `s`, `m`, `h`, `d`).
/// A bare number is rejected: a unit is required so that `10` is never silently 10 ns or
/// 10 hours.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{text}` has no unit; write e.g. `10s`, `500ms` or `2m`"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("`{text}` does not start with a number"))?;
    let nanos_per_unit: f64 = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        "d" => 86400e9,
        _ => return Err(format!("`{unit}` in `{text}` is not a unit; use ns, us, ms, s, m, h or d")),
    };
    let nanos = value * nanos_per_unit;
    if !nanos.is_finite() || nanos > u64::MAX as f64 {
        return Err(format!("`{text}` is too long"));
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}

/// Byte-size units accepted by [`parse_bytes`]: binary (`KiB` = 1024) and decimal (`KB` = 1000).
const BYTE_UNITS: [(&str, u64); 9] = [
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
];

/// Parses a byte size written as a number and a unit (`B`, `KiB`, `MiB`, `GiB`, `TiB`, or the
/// decimal `KB`, `MB`, `GB`, `TB`). Units are case-sensitive so that `kb` (kilobits to some) is
/// never guessed at. As with [`parse_duration`] a unit is required; a fraction is allowed
/// (`1.5GiB`) and rounded to the nearest byte.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{text}` has no unit; write e.g. `512KiB`, `1GiB` or `1B`"))?;
    let (number, unit) = text.split_at(split);
    let Some(&(_, bytes_per_unit)) = BYTE_UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(format!("`{unit}` in `{text}` is not a unit; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"));
    };
    let too_large = || format!("`{text}` is too large");
    // Whole numbers take the exact integer path: f64 cannot hold every u64.
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(bytes_per_unit).ok_or_else(too_large);
    }
    let value: f64 = number.parse().map_err(|_| format!("`{text}` does not start with a number"))?;
    let bytes = (value * bytes_per_unit as f64).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(too_large());
    }
    Ok(bytes as u64)
}

/// Formats a byte count with the largest binary unit that divides it exactly (`1GiB`,
/// `512MiB`, `1000B`), so that [`parse_bytes`] reads back the same number.
pub fn format_bytes(bytes: u64) -> String {
    let binary = BYTE_UNITS[..5].iter().rev();
    let (unit, size) = binary.copied().find(|&(_, size)| bytes != 0 && bytes.is_multiple_of(size)).unwrap_or(("B", 1));
    format!("{}{unit}", bytes / size)
}

/// Formats a duration with the largest unit that divides it exactly (`7d`, `90s`, `1500ms`), so
/// that [`parse_duration`] reads back the same duration.
pub fn format_duration(duration: Duration) -> String {
    const UNITS: [(&str, u128); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let nanos = duration.as_nanos();
    let (unit, size) =
        UNITS.into_iter().find(|&(_, size)| nanos != 0 && nanos.is_multiple_of(size)).unwrap_or(("s", 1_000_000_000));
    format!("{}{unit}", nanos / size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(7 * 86400));
    }

    #[test]
    fn rejects_bad_input() {
        for bad in ["", "10", "abc", "s", "10 parsecs", "1e400s", "-3s"] {
            assert!(parse_duration(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn parses_byte_sizes() {
        assert_eq!(parse_bytes("1B").unwrap(), 1);
        assert_eq!(parse_bytes("512KiB").unwrap(), 512 * 1024);
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("2TiB").unwrap(), 2 << 40);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("10KB").unwrap(), 10_000);
        assert_eq!(parse_bytes("3GB").unwrap(), 3_000_000_000);
        assert_eq!(parse_bytes(" 7MB ").unwrap(), 7_000_000);
        assert_eq!(parse_bytes("0B").unwrap(), 0);
    }

    #[test]
    fn rejects_bad_byte_sizes() {
        for bad in ["", "1", "B", "1 GiB", "1gib", "1kb", "1PiB", "-1B", "1.2.3B", "1e3B"] {
            assert!(parse_bytes(bad).is_err(), "{bad} was accepted");
        }
        assert!(parse_bytes("16777216TiB").unwrap_err().contains("too large"));
        assert!(parse_bytes("99999999999999999999B").unwrap_err().contains("too large"));
    }

    #[test]
    fn formats_round_trip() {
        assert_eq!(format_bytes(1 << 30), "1GiB");
        assert_eq!(format_bytes(512 << 20), "512MiB");
        assert_eq!(format_bytes(1000), "1000B");
        assert_eq!(format_bytes(0), "0B");
        assert_eq!(format_duration(Duration::from_secs(7 * 86400)), "7d");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
        for bytes in [1, 1023, 1024, 3 << 29, u64::MAX] {
            assert_eq!(parse_bytes(&format_bytes(bytes)).unwrap(), bytes);
        }
        for secs in [1, 59, 60, 3600, 86400, 86401] {
            let duration = Duration::from_secs(secs);
            assert_eq!(parse_duration(&format_duration(duration)).unwrap(), duration);
        }
    }

    proptest::proptest! {
        #[test]
        fn byte_sizes_round_trip(bytes: u64) {
            proptest::prop_assert_eq!(parse_bytes(&format_bytes(bytes)), Ok(bytes));
        }

        /// Below 2^53 ns every duration is exact in the f64 that `parse_duration` goes through.
        #[test]
        fn durations_round_trip(nanos in 0u64..(1 << 53)) {
            let duration = Duration::from_nanos(nanos);
            proptest::prop_assert_eq!(parse_duration(&format_duration(duration)), Ok(duration));
        }

        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,40}") {
            let _ = (parse_bytes(&text), parse_duration(&text));
        }
    }
}
