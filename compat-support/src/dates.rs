//! The vendors' date formats, for times held as milliseconds since the Unix epoch (UTC).
//!
//! Times outside what the formats can print (beyond year 9999) are clamped to the last
//! representable millisecond rather than panicking: a vendor date is informational.

use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{OffsetDateTime, UtcOffset};

/// The UTC date-time of `millis`, clamped to year 9999.
pub fn utc(millis: u64) -> OffsetDateTime {
    // 9999-12-31T23:59:59.999Z
    const MAX_MILLIS: u64 = 253_402_300_799_999;
    let nanos = i128::from(millis.min(MAX_MILLIS)) * 1_000_000;
    OffsetDateTime::from_unix_timestamp_nanos(nanos).expect("clamped to a representable time")
}

/// RFC 3339 in UTC with milliseconds: `2026-01-02T03:04:05.678Z`.
pub fn rfc3339_millis(millis: u64) -> String {
    let f =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    utc(millis)
        .format(f)
        .expect("the format has only numeric fields")
}

/// RFC 1123 (HTTP dates): `Wed, 01 Jan 2023 12:00:00 GMT`.
pub fn rfc1123(millis: u64) -> String {
    let f = format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    utc(millis)
        .format(f)
        .expect("the format has only known fields")
}

/// Go's `time.Time.String()` in UTC: `2026-01-02 03:04:05.678 +0000 UTC`.
pub fn go_time_string(millis: u64) -> String {
    let f = format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second].[subsecond digits:3] +0000 UTC"
    );
    utc(millis)
        .format(f)
        .expect("the format has only numeric fields")
}

/// Python's `str(datetime)` of a UTC-aware datetime: `2024-10-15 21:13:07.311000+00:00`, the
/// fraction left out when it is zero (as Python does).
pub fn python_str(millis: u64) -> String {
    let t = utc(millis);
    if t.millisecond() == 0 {
        let f = format_description!("[year]-[month]-[day] [hour]:[minute]:[second]+00:00");
        t.format(f).expect("numeric fields")
    } else {
        let f = format_description!(
            "[year]-[month]-[day] [hour]:[minute]:[second].[subsecond digits:6]+00:00"
        );
        t.format(f).expect("numeric fields")
    }
}

/// Parse an ISO 8601 date-time as vendor SDKs send it into ms since the epoch: `T` or a space
/// between date and time, an optional fraction, and `Z`, `±HH:MM`, `±HHMM` or no offset (a
/// naive time is UTC, as the Python SDKs append `Z`). `None` when it is not such a date-time
/// or lies before the epoch.
pub fn parse_iso8601(text: &str) -> Option<u64> {
    let t = text.trim();
    if t.len() < 19 || !t.is_char_boundary(10) || !t.is_char_boundary(19) {
        return None;
    }
    let (date, rest) = t.split_at(10);
    let rest = rest.strip_prefix(['T', 't', ' '])?;
    // Split the offset off the time: the first '+', '-', 'Z' or 'z' after the seconds.
    let cut = rest
        .char_indices()
        .skip(8)
        .find(|(_, c)| matches!(c, '+' | '-' | 'Z' | 'z'))
        .map(|(i, _)| i)
        .unwrap_or(rest.len());
    let (clock, offset) = rest.split_at(cut);
    let offset = match offset {
        "" | "Z" | "z" => "Z".to_string(),
        o if o.len() == 5 && !o.contains(':') => format!("{}:{}", &o[..3], &o[3..]),
        o => o.to_string(),
    };
    let parsed = OffsetDateTime::parse(&format!("{date}T{clock}{offset}"), &Rfc3339).ok()?;
    let millis = parsed.to_offset(UtcOffset::UTC).unix_timestamp_nanos() / 1_000_000;
    u64::try_from(millis).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_millis(1_767_323_045_678),
            "2026-01-02T03:04:05.678Z"
        );
        assert_eq!(rfc1123(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(rfc1123(1_672_574_400_000), "Sun, 01 Jan 2023 12:00:00 GMT");
        assert_eq!(
            go_time_string(1_767_323_045_678),
            "2026-01-02 03:04:05.678 +0000 UTC"
        );
        assert_eq!(python_str(0), "1970-01-01 00:00:00+00:00");
        assert_eq!(
            python_str(1_729_026_787_311),
            "2024-10-15 21:13:07.311000+00:00"
        );
        assert_eq!(rfc3339_millis(u64::MAX), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn parses_what_the_sdks_send() {
        let base = 1_767_323_045_000;
        assert_eq!(parse_iso8601("2026-01-02T03:04:05"), Some(base));
        assert_eq!(parse_iso8601("2026-01-02 03:04:05Z"), Some(base));
        assert_eq!(parse_iso8601("2026-01-02T03:04:05.678Z"), Some(base + 678));
        assert_eq!(
            parse_iso8601("2026-01-02T03:04:05.6789123"),
            Some(base + 678)
        );
        assert_eq!(parse_iso8601("2026-01-02T04:04:05+01:00"), Some(base));
        assert_eq!(parse_iso8601("2026-01-02T02:04:05-0100"), Some(base));
        for bad in [
            "",
            "2026-01-02",
            "2026-13-02T03:04:05",
            "2026-01-02X03:04:05",
            "1969-12-31T23:59:59Z",
            "2026-01-02T03:04:05.Z",
            "2026-01-02T03:04:05+1",
        ] {
            assert_eq!(parse_iso8601(bad), None, "{bad:?}");
        }
    }
}
