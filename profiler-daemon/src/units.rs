//! Human units on the command line and in the config: durations such as `10s`, `500ms`, `2m`.

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
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a number"))?;
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
}
