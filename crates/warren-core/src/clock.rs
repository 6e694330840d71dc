//! Wall-clock timestamps as Warren records them (RFC 3339, UTC).

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

pub fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// Seconds since the Unix epoch, UTC (for signed, expiring tokens).
pub fn unix_now() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}
