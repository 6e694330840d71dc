//! The amounts a spec is written in: bytes, durations and CPU, each
//! taking a number or text (`"256M"`, `"10m"`, `"500m"`) and refusing what
//! the node could not hold.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::ToSchema;

use crate::quantity::{self, QuantityError};

/// A byte size; accepts `268435456` or `"256M"`, serialises as bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ToSchema)]
#[schema(value_type = String, example = "256M")]
pub struct ByteSize(pub u64);

/// A duration; accepts `"30s"`, `"10m"` or a number of seconds, serialises as text.
/// At most [`quantity::MAX_DURATION`]: made only by [`Dur::new`],
/// [`Dur::from_secs`] or deserialisation, so no front door can hand the
/// control plane a TTL, lease or timeout that a clock cannot be advanced by
/// or the store cannot hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ToSchema)]
#[schema(value_type = String, example = "10m")]
pub struct Dur(Duration);

impl Dur {
    /// `d`, or an error naming it if it is longer than [`quantity::MAX_DURATION`].
    pub fn new(d: Duration) -> Result<Dur, QuantityError> {
        quantity::bounded(d, &quantity::format_duration(d)).map(Dur)
    }

    /// `secs` seconds, or an error if that is longer than [`quantity::MAX_DURATION`].
    pub fn from_secs(secs: u64) -> Result<Dur, QuantityError> {
        if secs > quantity::MAX_DURATION.as_secs() {
            return Err(QuantityError::DurationTooLong(format!("{secs}s")));
        }
        Ok(Dur(Duration::from_secs(secs)))
    }

    /// Text such as `"30s"`, `"10m"` or `"1h30m"` (see [`quantity::parse_duration`]).
    pub fn parse(text: &str) -> Result<Dur, QuantityError> {
        quantity::parse_duration(text).map(Dur)
    }

    pub const fn get(self) -> Duration {
        self.0
    }
}

/// CPU in millicores; accepts `0.5`, `"2"` or `"500m"`, serialises as cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ToSchema)]
#[schema(value_type = f64, example = 0.5)]
pub struct Cpu(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrText {
    Int(u64),
    Float(f64),
    Text(String),
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrText::deserialize(d)? {
            NumOrText::Int(n) => Ok(ByteSize(n)),
            NumOrText::Float(f) => quantity::parse_size(&f.to_string()).map(ByteSize),
            NumOrText::Text(s) => quantity::parse_size(&s).map(ByteSize),
        }
        .map_err(serde::de::Error::custom)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrText::deserialize(d)? {
            NumOrText::Int(n) => Dur::from_secs(n),
            NumOrText::Float(f) if f.is_finite() && f >= 0.0 => {
                if f > quantity::MAX_DURATION.as_secs_f64() {
                    Err(QuantityError::DurationTooLong(format!("{f}s")))
                } else {
                    Ok(Dur(quantity::millis(f)))
                }
            }
            NumOrText::Float(f) => Err(QuantityError::Duration(f.to_string())),
            NumOrText::Text(s) => quantity::parse_duration(&s).map(Dur),
        }
        .map_err(serde::de::Error::custom)
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&quantity::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for Cpu {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrText::deserialize(d)? {
            NumOrText::Int(n) => quantity::parse_cpu(&n.to_string()).map(Cpu),
            NumOrText::Float(f) => quantity::parse_cpu(&f.to_string()).map(Cpu),
            NumOrText::Text(s) => quantity::parse_cpu(&s).map(Cpu),
        }
        .map_err(serde::de::Error::custom)
    }
}

impl Serialize for Cpu {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0 as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A door that builds a duration itself (E2B's `timeout` in seconds, a
    // Connect deadline in milliseconds) gets the same ceiling as JSON.
    #[test]
    fn a_duration_is_made_only_within_the_ceiling() {
        let max = quantity::MAX_DURATION;
        assert_eq!(Dur::new(max).unwrap().get(), max);
        assert_eq!(Dur::from_secs(max.as_secs()).unwrap().get(), max);
        for e in [
            Dur::new(max + Duration::from_millis(1)).unwrap_err(),
            Dur::new(Duration::MAX).unwrap_err(),
            Dur::from_secs(max.as_secs() + 1).unwrap_err(),
            Dur::from_secs(u64::MAX).unwrap_err(),
            Dur::parse("366d").unwrap_err(),
        ] {
            assert!(matches!(e, QuantityError::DurationTooLong(_)), "{e}");
        }
        assert_eq!(Dur::parse("90s").unwrap().get(), Duration::from_secs(90));
    }
}
