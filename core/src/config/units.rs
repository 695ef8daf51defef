//! Durations, rates and region weights as written in limits files.
//!
//! Pure string functions: they return the problem as text and the caller adds file, line and
//! path. Everything is integer arithmetic so that `0.3` is exactly 300000 ppm and `90s` is
//! exactly 90 seconds.

use std::time::Duration;

use crate::limit::WEIGHT_SCALE_PPM;

/// The rate limit units envoyproxy/ratelimit knows, with their lengths (a month is 30 days and
/// a year 365 days, as there).
const RATE_LIMIT_UNITS: [(&str, u64); 7] = [
    ("second", 1),
    ("minute", 60),
    ("hour", 3_600),
    ("day", 86_400),
    ("week", 604_800),
    ("month", 2_592_000),
    ("year", 31_536_000),
];

/// The list shown when a unit is not one of [`RATE_LIMIT_UNITS`].
pub const RATE_LIMIT_UNITS_HELP: &str = "second, minute, hour, day, week, month or year";

/// Suffixes of a duration such as `250ms` or `1h30m`, longest first so `ms` wins over `m`.
const DURATION_SUFFIXES: [(&str, Duration); 5] = [
    ("ms", Duration::from_millis(1)),
    ("s", Duration::from_secs(1)),
    ("m", Duration::from_secs(60)),
    ("h", Duration::from_secs(3_600)),
    ("d", Duration::from_secs(86_400)),
];

/// Fractional digits a weight may have: weights are stored in parts per million.
const WEIGHT_DECIMALS: usize = 6;

/// The length of an envoyproxy/ratelimit `unit`, matched case-insensitively as it does.
pub fn rate_limit_unit(unit: &str) -> Option<Duration> {
    RATE_LIMIT_UNITS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(unit))
        .map(|(_, secs)| Duration::from_secs(*secs))
}

/// Parses `250ms`, `90s`, `15m`, `1h`, `1d` or a sum of them written together (`1h30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let help = "expected a duration such as 250ms, 90s, 15m, 1h or 1d";
    if text.is_empty() {
        return Err(format!("empty duration ({help})"));
    }
    let mut rest = text;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("invalid duration '{text}' ({help})"));
        }
        let (number, tail) = rest.split_at(digits);
        let Some((suffix, unit)) = DURATION_SUFFIXES.iter().find(|(s, _)| tail.starts_with(s))
        else {
            return Err(format!(
                "invalid duration '{text}': missing or unknown unit after {number} ({help})"
            ));
        };
        let count: u32 = number
            .parse()
            .map_err(|_| format!("duration '{text}' is too long"))?;
        total = unit
            .checked_mul(count)
            .and_then(|part| total.checked_add(part))
            .ok_or_else(|| format!("duration '{text}' is too long"))?;
        rest = &tail[suffix.len()..];
    }
    Ok(total)
}

/// A rate: `units` per `per`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub units: u64,
    pub per: Duration,
}

/// Parses `N/unit` (`100/minute`, any rate limit unit) or `N/duration` (`100/10s`, and
/// `100/s` for one second).
pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let help = "expected a rate such as 100/s, 100/minute or 100/10s";
    let Some((count, per)) = text.split_once('/') else {
        return Err(format!("invalid rate '{text}' ({help})"));
    };
    let units: u64 = count
        .trim()
        .parse()
        .map_err(|_| format!("invalid rate '{text}': '{count}' is not a whole number ({help})"))?;
    if units == 0 {
        return Err(format!(
            "rate '{text}' admits nothing: the count must be at least 1"
        ));
    }
    let per = per.trim();
    let per = match rate_limit_unit(per) {
        Some(unit) => unit,
        None if per.starts_with(|c: char| c.is_ascii_digit()) => parse_duration(per)?,
        None => parse_duration(&format!("1{per}"))
            .map_err(|_| format!("invalid rate '{text}' ({help})"))?,
    };
    if per.is_zero() {
        return Err(format!("rate '{text}' has a zero period"));
    }
    Ok(Rate { units, per })
}

/// Parses a region weight between 0 and 1 with at most six decimals into parts per million.
/// Values above one are returned as they are, so the caller can name the excess.
pub fn parse_weight_ppm(text: &str) -> Result<u64, String> {
    let help = "expected a number between 0 and 1, such as 0.25";
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !all_digits(whole) || !all_digits(fraction) {
        return Err(format!("invalid weight '{text}' ({help})"));
    }
    if fraction.len() > WEIGHT_DECIMALS {
        return Err(format!(
            "weight '{text}' has more than {WEIGHT_DECIMALS} decimals (weights are kept in parts per million)"
        ));
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole
            .parse()
            .map_err(|_| format!("weight '{text}' is far above 1"))?
    };
    let mut fraction_ppm: u64 = 0;
    for (i, b) in fraction.bytes().enumerate() {
        let place = 10u64.pow((WEIGHT_DECIMALS - 1 - i) as u32);
        fraction_ppm += u64::from(b - b'0') * place;
    }
    whole
        .checked_mul(WEIGHT_SCALE_PPM)
        .and_then(|w| w.checked_add(fraction_ppm))
        .ok_or_else(|| format!("weight '{text}' is far above 1"))
}

/// Formats parts per million as the shortest decimal (`300000` -> `0.3`).
pub fn format_ppm(ppm: u64) -> String {
    let whole = ppm / WEIGHT_SCALE_PPM;
    let fraction = ppm % WEIGHT_SCALE_PPM;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Formats a duration in the largest unit that divides it (`90s`, `15m`, `30d`, `250ms`),
/// so every window printed can be pasted back into a limits file.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    const UNITS: [(&str, u128); 6] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("ns", 1),
    ];
    if nanos == 0 {
        return "0s".to_owned();
    }
    let (suffix, len) = UNITS
        .iter()
        .find(|(_, len)| nanos.is_multiple_of(*len))
        .copied()
        .unwrap_or(("ns", 1));
    format!("{}{suffix}", nanos / len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_case_insensitive_and_month_is_thirty_days() {
        assert_eq!(rate_limit_unit("MINUTE"), Some(Duration::from_secs(60)));
        assert_eq!(rate_limit_unit("Hour"), Some(Duration::from_secs(3_600)));
        // 30 * 86400 = 2592000; 365 * 86400 = 31536000.
        assert_eq!(
            rate_limit_unit("month"),
            Some(Duration::from_secs(2_592_000))
        );
        assert_eq!(
            rate_limit_unit("year"),
            Some(Duration::from_secs(31_536_000))
        );
        assert_eq!(rate_limit_unit("fortnight"), None);
        assert_eq!(rate_limit_unit(""), None);
    }

    #[test]
    fn durations_parse_single_and_compound_forms() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        // 1h30m = 3600 + 1800 = 5400 s.
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        for bad in [
            "",
            "90",
            "s",
            "1.5h",
            "10x",
            "1h 30m",
            "-1s",
            "99999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn rates_take_a_unit_word_or_a_duration() {
        let per_minute = Rate {
            units: 100,
            per: Duration::from_secs(60),
        };
        assert_eq!(parse_rate("100/minute"), Ok(per_minute));
        assert_eq!(parse_rate("100/1m"), Ok(per_minute));
        assert_eq!(
            parse_rate("100/s"),
            Ok(Rate {
                units: 100,
                per: Duration::from_secs(1)
            })
        );
        assert_eq!(
            parse_rate("5/250ms"),
            Ok(Rate {
                units: 5,
                per: Duration::from_millis(250)
            })
        );
        for bad in [
            "100",
            "0/s",
            "x/s",
            "100/fortnight",
            "100/0s",
            "-1/s",
            "100/",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn weights_are_exact_parts_per_million() {
        // 0.3 as a float is 0.29999999999999998; parsed as a decimal it is exactly 300000.
        assert_eq!(parse_weight_ppm("0.3"), Ok(300_000));
        assert_eq!(parse_weight_ppm("1"), Ok(1_000_000));
        assert_eq!(parse_weight_ppm(".25"), Ok(250_000));
        assert_eq!(parse_weight_ppm("0.000001"), Ok(1));
        assert_eq!(parse_weight_ppm("1.5"), Ok(1_500_000));
        for bad in ["", ".", "-0.1", "0.1234567", "1e-3", "half"] {
            assert!(parse_weight_ppm(bad).is_err(), "{bad:?} must be rejected");
        }
        assert_eq!(format_ppm(300_000), "0.3");
        assert_eq!(format_ppm(1_100_000), "1.1");
        assert_eq!(format_ppm(1), "0.000001");
    }

    #[test]
    fn durations_print_in_the_largest_exact_unit() {
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(900)), "15m");
        assert_eq!(format_duration(Duration::from_secs(2_592_000)), "30d");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        for text in ["250ms", "90s", "1h30m", "7d"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }
}
