//! Human-friendly quantities used in specs and on the command line: byte sizes
//! (`256M`, `1Gi`, `1048576`), durations (`500ms`, `30s`, `10m`, `2h`) and CPU
//! amounts (`0.5`, `2`, `500m`).

use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error("invalid size {0:?}: use a number of bytes or a number with a unit K, M, G or T (e.g. 256M, 1G)")]
    Size(String),
    #[error(
        "invalid duration {0:?}: use a number with a unit ms, s, m, h or d (e.g. 30s, 10m, 2h)"
    )]
    Duration(String),
    #[error("duration {0:?} is longer than the longest Warren accepts, 365d")]
    DurationTooLong(String),
    #[error("invalid cpu amount {0:?}: use cores as a decimal (0.5, 2) or millicores (500m)")]
    Cpu(String),
}

/// The longest duration accepted anywhere (TTLs, leases, keep periods,
/// exec timeouts, node settings): a year. Anything longer is a mistake (a
/// TTL sent in nanoseconds, say), and every duration below it can be added
/// to a clock, stored and read back.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 86400);

/// Checks a duration against [`MAX_DURATION`]; `shown` is what the user wrote.
pub fn bounded(d: Duration, shown: &str) -> Result<Duration, QuantityError> {
    if d > MAX_DURATION {
        return Err(QuantityError::DurationTooLong(shown.to_string()));
    }
    Ok(d)
}

/// Parses a byte size. Units are binary (K = 1024), as for memory limits in
/// Docker and Kubernetes' `Ki`/`Mi`; the optional `i`/`B` suffixes are accepted.
pub fn parse_size(input: &str) -> Result<u64, QuantityError> {
    let err = || QuantityError::Size(input.to_string());
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(err());
    }
    let value: f64 = num.parse().map_err(|_| err())?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.trim_end_matches('b').trim_end_matches('i');
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return Err(err()),
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes.round() as u64)
}

/// Formats a byte count with the largest binary unit that divides it exactly.
pub fn format_size(bytes: u64) -> String {
    for (unit, mult) in [
        ("T", 1u64 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ] {
        if bytes >= mult && bytes.is_multiple_of(mult) {
            return format!("{}{}", bytes / mult, unit);
        }
    }
    bytes.to_string()
}

/// Whole milliseconds: the finest unit `format_duration` writes, so a
/// duration that is stored and read back stays the same.
pub fn millis(secs: f64) -> Duration {
    Duration::from_millis((secs * 1000.0).round() as u64)
}

/// Parses a duration, rounded to whole milliseconds.
pub fn parse_duration(input: &str) -> Result<Duration, QuantityError> {
    let err = || QuantityError::Duration(input.to_string());
    let s = input.trim();
    if s.is_empty() {
        return Err(err());
    }
    // Accept compound forms such as `1h30m`.
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let (num, tail) = rest.split_at(split);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let value: f64 = num.parse().map_err(|_| err())?;
        let secs = match unit {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            "d" => value * 86400.0,
            _ => return Err(err()),
        };
        if !secs.is_finite() || secs < 0.0 {
            return Err(err());
        }
        if secs > MAX_DURATION.as_secs_f64() {
            return Err(QuantityError::DurationTooLong(input.to_string()));
        }
        // Each part is below a year, so the sum cannot overflow; the total
        // is checked again.
        total += millis(secs);
        rest = next;
    }
    bounded(total, input)
}

pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Parses a CPU amount into millicores.
pub fn parse_cpu(input: &str) -> Result<u64, QuantityError> {
    let err = || QuantityError::Cpu(input.to_string());
    let s = input.trim();
    let millis = if let Some(m) = s.strip_suffix('m') {
        m.parse::<f64>().map_err(|_| err())?
    } else {
        s.parse::<f64>().map_err(|_| err())? * 1000.0
    };
    if !millis.is_finite() || !(0.0..=1e9).contains(&millis) {
        return Err(err());
    }
    Ok(millis.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("10kb"), Ok(10240));
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").is_err());
        assert_eq!(format_size(256 << 20), "256M");
        assert_eq!(format_size(1000), "1000");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5y").is_err());
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
    }

    // Found by the `spec` fuzz target in CI: each part was accepted (at most
    // 10^12 s) but their sum could not be formatted and parsed back, so a
    // stored spec became unreadable (fuzz/seeds/spec/duration-sum.json).
    #[test]
    fn durations_are_bounded_in_total_not_just_per_part() {
        assert_eq!(
            parse_duration("991999999999s91999999999s"),
            Err(QuantityError::DurationTooLong(
                "991999999999s91999999999s".into()
            ))
        );
        assert!(parse_duration("200d200d").is_err());
        assert_eq!(parse_duration("365d"), Ok(MAX_DURATION));
        assert!(parse_duration("366d").is_err());
        let d = parse_duration("364d23h59m59s999ms").unwrap();
        assert_eq!(parse_duration(&format_duration(d)), Ok(d));
    }

    // Found by the `spec` fuzz target: "5.5ms" was kept to the nanosecond
    // but stored as "5ms", so a spec read back differed from the one
    // accepted ("0.4ms" even turned into a zero, refused, ttl).
    #[test]
    fn durations_are_whole_milliseconds_and_survive_formatting() {
        assert_eq!(parse_duration("5.5ms"), Ok(Duration::from_millis(6)));
        assert_eq!(parse_duration("0.4ms"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.0005s"), Ok(Duration::from_millis(1001)));
        for text in ["5.5ms", "1.5h", "0.25s", "1h30m250ms", "2d"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{text}");
        }
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpu("0.5"), Ok(500));
        assert_eq!(parse_cpu("2"), Ok(2000));
        assert_eq!(parse_cpu("250m"), Ok(250));
        assert!(parse_cpu("-1").is_err());
        assert!(parse_cpu("abc").is_err());
    }
}
