//! Cron expressions (five-field, Vixie-cron style) and next-fire-time calculation, in UTC or
//! in an IANA time zone.
//!
//! Supported syntax, per field (`minute hour day-of-month month day-of-week`):
//! `*`, `N`, `A-B`, `*/S`, `A-B/S`, `A/S` (A through the field maximum, step S) and comma
//! separated lists of those. Months accept `JAN`-`DEC`, days of week accept `SUN`-`SAT`
//! (case-insensitive); day of week `0` and `7` are both Sunday. The macros `@yearly`,
//! `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight` and `@hourly` are accepted.
//!
//! Day matching follows Vixie cron: when both the day-of-month and the day-of-week field
//! are restricted (neither starts with `*`), a day matches when either field matches;
//! otherwise both must match (a field starting with `*`, such as `*/2`, counts as `*`).
//!
//! # Time zones
//!
//! [`CronSchedule::next_after`] reads the five fields as UTC wall-clock time;
//! [`CronSchedule::next_after_in`] reads them as wall-clock time in a [`Tz`] (an IANA zone
//! such as `Europe/Berlin`, see [`parse_time_zone`]). Where the zone's clocks jump, these
//! rules apply (`next_after` is `next_after_in` with [`Tz::UTC`], which has no jumps):
//!
//! - **Gap** (clocks spring forward, e.g. 02:00 -> 03:00): a matching wall-clock time that
//!   does not exist fires at the first instant after the gap (03:00 local). However many
//!   matching times fall inside one gap, and whether or not the first time after the gap
//!   matches too, that instant fires once.
//! - **Overlap** (clocks fall back, e.g. 03:00 -> 02:00): a matching wall-clock time that
//!   occurs twice fires once, at its earlier instant; the repeated hour fires nothing.
//! - Put together: a wall-clock time `M` that matches fires at the first instant at which the
//!   zone's clock reads `M` or later. Successive results are strictly increasing
//!   (`next_after_in(t) > t`), so no instant fires twice and nothing goes back.
//! - Offsets need not be whole hours (`Asia/Kolkata` +05:30, `Asia/Kathmandu` +05:45,
//!   `Australia/Lord_Howe`, whose DST shift is 30 minutes). A fire time is the instant at which
//!   the local clock shows a whole minute (or the end of a gap). Every offset in use since
//!   1972-01-07 is a whole number of minutes, so fire times since then are whole minutes in UTC
//!   too; only older offsets with seconds (Liberia's -00:44:30 until that day, 19th-century
//!   local mean times) give fire times with seconds.
//! - Cost stays bounded as for UTC: a field-wise search on local time plus one zone lookup per
//!   candidate, never a minute-by-minute scan.
//!
//! Zone data comes from `chrono-tz` (compiled in); future dates use the rules it was built
//! with.

use std::fmt;
use std::str::FromStr;

use chrono::{
    DateTime, Datelike, MappedLocalTime, NaiveDate, NaiveDateTime, Offset, TimeDelta, TimeZone,
    Timelike,
};
use chrono_tz::GapInfo;
use thiserror::Error;

/// An IANA time zone name, parsed (e.g. "Europe/Berlin", "UTC"). Re-exported from `chrono-tz`
/// so callers need no import of their own; obtain one with [`parse_time_zone`].
pub use chrono_tz::Tz;

/// Longest accepted expression, in characters (after trimming surrounding whitespace).
pub const MAX_CRON_EXPR_LEN: usize = 1000;

/// Longest accepted time-zone name, in characters (the longest IANA name has 32).
pub const MAX_TIME_ZONE_NAME_LEN: usize = 100;

const MAX_YEAR: i32 = 9999;
/// The Gregorian calendar, weekdays included, repeats every 400 years (146097 days, a whole
/// number of weeks), so a schedule that does not fire within 400 years never fires.
const MAX_MONTHS_SCANNED: u32 = 400 * 12 + 1;
/// How many matching wall-clock minutes `next_after_in` may pass over because they already
/// occurred before `after` (the repeated part of a fall-back overlap). Real overlaps last at
/// most 24 hours (the largest in tzdb, Alaska's 1867 date-line change), so this is never reached
/// with real zone data; it only guarantees termination.
const MAX_PASSED_CANDIDATES: u32 = 4 * 24 * 60;

/// One of the five fields of a cron expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CronField {
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
}

const FIELDS: [CronField; 5] = [
    CronField::Minute,
    CronField::Hour,
    CronField::DayOfMonth,
    CronField::Month,
    CronField::DayOfWeek,
];

const MONTH_NAMES: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

impl CronField {
    /// Smallest accepted value.
    pub fn min(self) -> u32 {
        match self {
            CronField::Minute | CronField::Hour | CronField::DayOfWeek => 0,
            CronField::DayOfMonth | CronField::Month => 1,
        }
    }

    /// Largest accepted value (day of week accepts 7 as an alias for Sunday).
    pub fn max(self) -> u32 {
        match self {
            CronField::Minute => 59,
            CronField::Hour => 23,
            CronField::DayOfMonth => 31,
            CronField::Month => 12,
            CronField::DayOfWeek => 7,
        }
    }

    /// Upper end of `*` and of the open form `A/S` (Saturday for day of week, so that
    /// Sunday is not selected twice).
    fn wildcard_max(self) -> u32 {
        match self {
            CronField::DayOfWeek => 6,
            other => other.max(),
        }
    }

    fn lookup_name(self, name: &str) -> Option<u32> {
        let names: &[&str] = match self {
            CronField::Month => &MONTH_NAMES,
            CronField::DayOfWeek => &DAY_NAMES,
            _ => return None,
        };
        let index = names.iter().position(|n| n.eq_ignore_ascii_case(name))?;
        let index = u32::try_from(index).ok()?;
        Some(if self == CronField::Month {
            index + 1
        } else {
            index
        })
    }

    fn name_hint(self) -> &'static str {
        match self {
            CronField::Month => "use 1-12 or JAN-DEC",
            CronField::DayOfWeek => "use 0-7 or SUN-SAT",
            _ => "this field accepts numbers only",
        }
    }
}

impl fmt::Display for CronField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CronField::Minute => "minute",
            CronField::Hour => "hour",
            CronField::DayOfMonth => "day of month",
            CronField::Month => "month",
            CronField::DayOfWeek => "day of week",
        })
    }
}

/// Why a cron expression was rejected. `expr` is the trimmed expression.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CronError {
    #[error("cron expression is empty (expected 5 fields \"minute hour day-of-month month day-of-week\" or a macro such as @daily)")]
    Empty,
    #[error("cron expression is too long ({len} characters; at most {max} allowed)", max = MAX_CRON_EXPR_LEN)]
    TooLong { len: usize },
    /// `position` is the 1-based character position in the input.
    #[error("cron expression contains the non-ASCII character {ch:?} at position {position}; only ASCII is allowed")]
    NonAscii { ch: char, position: usize },
    #[error("cron expression {expr:?}: @reboot is not supported (only time-based schedules are)")]
    RebootNotSupported { expr: String },
    #[error("cron expression {expr:?}: unknown macro (supported: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly)")]
    UnknownMacro { expr: String },
    #[error("cron expression {expr:?}: expected 5 fields (minute hour day-of-month month day-of-week), found {found}")]
    WrongFieldCount { expr: String, found: usize },
    #[error(
        "cron expression {expr:?}: {field}: value {value} is out of range (allowed {min}-{max})"
    )]
    OutOfRange {
        expr: String,
        field: CronField,
        value: u32,
        min: u32,
        max: u32,
    },
    #[error("cron expression {expr:?}: {field}: number {digits} is too large")]
    NumberTooLarge {
        expr: String,
        field: CronField,
        digits: String,
    },
    #[error("cron expression {expr:?}: {field}: range {range:?} starts after it ends")]
    ReversedRange {
        expr: String,
        field: CronField,
        range: String,
    },
    #[error("cron expression {expr:?}: {field}: step must be at least 1")]
    ZeroStep { expr: String, field: CronField },
    #[error("cron expression {expr:?}: {field}: step {step} is too large (at most {max})")]
    StepTooLarge {
        expr: String,
        field: CronField,
        step: u32,
        max: u32,
    },
    #[error("cron expression {expr:?}: {field}: unknown name {name:?} ({})", .field.name_hint())]
    UnknownName {
        expr: String,
        field: CronField,
        name: String,
    },
    #[error("cron expression {expr:?}: {field}: '?' is not supported (use * instead)")]
    QuestionMarkNotSupported { expr: String, field: CronField },
    #[error("cron expression {expr:?}: {field}: invalid character {ch:?}")]
    InvalidCharacter {
        expr: String,
        field: CronField,
        ch: char,
    },
    #[error("cron expression {expr:?}: {field}: malformed item {item:?} (expected *, N, A-B, */S, A-B/S or A/S)")]
    MalformedItem {
        expr: String,
        field: CronField,
        item: String,
    },
    #[error("cron expression {expr:?}: {field}: empty item in comma-separated list")]
    EmptyListItem { expr: String, field: CronField },
    /// Returned by [`parse_time_zone`]. `name` is the name as given (cut to
    /// [`MAX_TIME_ZONE_NAME_LEN`] characters, followed by `...`, when longer).
    #[error("time zone {name:?}: unknown (an IANA name such as \"Europe/Berlin\" or \"UTC\")")]
    UnknownTimeZone { name: String },
}

/// Parses an IANA time-zone name such as `Europe/Berlin`, `America/New_York` or `UTC`
/// (surrounding whitespace ignored).
///
/// Exact (case-sensitive) IANA names are looked up first; failing that, a name that equals an
/// IANA name ignoring ASCII case (`europe/berlin`, `utc`) is accepted too and gives that zone.
/// tzdb never has two names differing only in case, so this is unambiguous. Legacy aliases
/// that tzdb still ships (`US/Eastern`, `Etc/GMT+5`, `CET`) are accepted. Names longer than
/// [`MAX_TIME_ZONE_NAME_LEN`] characters, non-ASCII names and unknown names give
/// [`CronError::UnknownTimeZone`].
pub fn parse_time_zone(name: &str) -> Result<Tz, CronError> {
    let unknown = || {
        let shown: String = name.chars().take(MAX_TIME_ZONE_NAME_LEN).collect();
        let shown = if shown.len() < name.len() {
            shown + "..."
        } else {
            shown
        };
        CronError::UnknownTimeZone { name: shown }
    };
    let trimmed = name.trim();
    if !trimmed.is_ascii() || trimmed.len() > MAX_TIME_ZONE_NAME_LEN || trimmed.is_empty() {
        return Err(unknown());
    }
    if let Ok(tz) = trimmed.parse::<Tz>() {
        return Ok(tz);
    }
    chrono_tz::TZ_VARIANTS
        .iter()
        .copied()
        .find(|tz| tz.name().eq_ignore_ascii_case(trimmed))
        .ok_or_else(unknown)
}

/// A field-level problem, turned into a [`CronError`] once the expression and field are known.
enum FieldProblem {
    OutOfRange(u32),
    NumberTooLarge(String),
    ReversedRange(String),
    ZeroStep,
    StepTooLarge(u32),
    UnknownName(String),
    QuestionMark,
    InvalidCharacter(char),
    Malformed(String),
    EmptyItem,
}

impl FieldProblem {
    fn into_error(self, expr: &str, field: CronField) -> CronError {
        let expr = expr.to_string();
        match self {
            FieldProblem::OutOfRange(value) => CronError::OutOfRange {
                expr,
                field,
                value,
                min: field.min(),
                max: field.max(),
            },
            FieldProblem::NumberTooLarge(digits) => CronError::NumberTooLarge {
                expr,
                field,
                digits,
            },
            FieldProblem::ReversedRange(range) => CronError::ReversedRange { expr, field, range },
            FieldProblem::ZeroStep => CronError::ZeroStep { expr, field },
            FieldProblem::StepTooLarge(step) => CronError::StepTooLarge {
                expr,
                field,
                step,
                max: field.max(),
            },
            FieldProblem::UnknownName(name) => CronError::UnknownName { expr, field, name },
            FieldProblem::QuestionMark => CronError::QuestionMarkNotSupported { expr, field },
            FieldProblem::InvalidCharacter(ch) => CronError::InvalidCharacter { expr, field, ch },
            FieldProblem::Malformed(item) => CronError::MalformedItem { expr, field, item },
            FieldProblem::EmptyItem => CronError::EmptyListItem { expr, field },
        }
    }
}

/// A parsed cron expression: minute hour day-of-month month day-of-week, evaluated in UTC
/// ([`next_after`](Self::next_after)) or a time zone ([`next_after_in`](Self::next_after_in)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronSchedule {
    expr: String,
    /// Bit `n` set when minute `n` (0-59) is selected.
    minutes: u64,
    /// Bit `n` set when hour `n` (0-23) is selected.
    hours: u64,
    /// Bit `n` set when day of month `n` (1-31) is selected.
    days_of_month: u64,
    /// Bit `n` set when month `n` (1-12) is selected.
    months: u64,
    /// Bit `n` set when weekday `n` (0 = Sunday .. 6 = Saturday) is selected.
    days_of_week: u64,
    /// The day-of-month field starts with `*` (Vixie rule).
    dom_star: bool,
    /// The day-of-week field starts with `*` (Vixie rule).
    dow_star: bool,
}

impl CronSchedule {
    /// Whether both select the same times, however they are written: the
    /// fields' sets and the two `*` flags (which decide how the day fields
    /// combine) are all a schedule's times depend on.
    pub fn same_times(&self, other: &CronSchedule) -> bool {
        (
            self.minutes,
            self.hours,
            self.days_of_month,
            self.months,
            self.days_of_week,
            self.dom_star,
            self.dow_star,
        ) == (
            other.minutes,
            other.hours,
            other.days_of_month,
            other.months,
            other.days_of_week,
            other.dom_star,
            other.dow_star,
        )
    }

    /// Parses a five-field cron expression or a macro such as `@daily`.
    pub fn parse(expr: &str) -> Result<CronSchedule, CronError> {
        if let Some((index, ch)) = expr.chars().enumerate().find(|(_, c)| !c.is_ascii()) {
            return Err(CronError::NonAscii {
                ch,
                position: index + 1,
            });
        }
        let trimmed = expr.trim();
        if trimmed.is_empty() {
            return Err(CronError::Empty);
        }
        if trimmed.len() > MAX_CRON_EXPR_LEN {
            return Err(CronError::TooLong { len: trimmed.len() });
        }

        let body = if trimmed.starts_with('@') {
            expand_macro(trimmed)?
        } else {
            trimmed
        };

        let parts: Vec<&str> = body.split_ascii_whitespace().collect();
        if parts.len() != FIELDS.len() {
            return Err(CronError::WrongFieldCount {
                expr: trimmed.to_string(),
                found: parts.len(),
            });
        }

        let mut bits = [0u64; 5];
        for ((slot, text), field) in bits.iter_mut().zip(&parts).zip(FIELDS) {
            *slot = parse_field(text, field).map_err(|p| p.into_error(trimmed, field))?;
        }
        let [minutes, hours, days_of_month, months, days_of_week] = bits;

        Ok(CronSchedule {
            expr: trimmed.to_string(),
            minutes,
            hours,
            days_of_month,
            months,
            days_of_week,
            dom_star: parts[2].starts_with('*'),
            dow_star: parts[4].starts_with('*'),
        })
    }

    /// The first fire time strictly after `after_ms` (milliseconds since the Unix epoch, UTC),
    /// in ms (always a whole minute), or None when the expression can never fire again
    /// (e.g. "0 0 30 2 *") or the next fire is beyond year 9999.
    ///
    /// The same as [`next_after_in`](Self::next_after_in) with [`Tz::UTC`].
    ///
    /// Cost: the search jumps field-wise (month, then day, then hour, then minute). It visits
    /// at most `MAX_MONTHS_SCANNED` (~4800, one full 400-year Gregorian cycle) selected
    /// months, doing at most 31 day checks per month; only the first candidate day can fail
    /// at the hour/minute level (at most 24 hour probes, each with an O(1) minute lookup).
    /// So the worst case (an expression that never fires) is O(4800 * 31) cheap steps.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        self.next_after_in(after_ms, Tz::UTC)
    }

    /// The first fire time strictly after `after_ms` (milliseconds since the Unix epoch), the
    /// five fields read as wall-clock time in `tz`; in ms since the epoch. None when the
    /// expression can never fire again, when the next matching wall-clock time is beyond year
    /// 9999, or when `after_ms` is outside the calendar's range.
    ///
    /// Daylight-saving rules (see the [module docs](self)):
    /// - a matching wall-clock time skipped by a spring-forward gap fires at the first instant
    ///   after the gap (02:30 on a 02:00 -> 03:00 day fires at 03:00 local); all matching times
    ///   in one gap, and 03:00 itself if it matches, make a single fire at that instant;
    /// - a matching wall-clock time that occurs twice (fall-back overlap) fires only at its
    ///   earlier instant;
    /// - results are strictly increasing: `next_after_in(r, tz) > r` for any result `r`.
    ///
    /// The result is the instant the local clock shows a whole minute (or the end of a gap),
    /// a whole minute in UTC for every zone offset in use since 1972-01-07 (`+05:30` and
    /// `+05:45` included); only older offsets with seconds give results with seconds.
    ///
    /// Cost: the same field-wise search as [`next_after`](Self::next_after), run on local
    /// time, plus one zone lookup (a binary search over the zone's transitions) per candidate.
    /// Only candidates in the repeated hour of an overlap that `after_ms` lies in can be
    /// rejected, so at most one overlap's worth of extra candidates (60 for a one-hour
    /// DST shift) is ever examined.
    pub fn next_after_in(&self, after_ms: i64, tz: Tz) -> Option<i64> {
        let after = after_ms.div_euclid(1000);
        let after_utc = DateTime::from_timestamp(after, 0)?.naive_utc();
        let local_now =
            after_utc.checked_add_offset(tz.offset_from_utc_datetime(&after_utc).fix())?;
        // Every wall-clock time up to `local_now` was already shown at or before `after`, so
        // the first candidate is the next whole local minute.
        let mut from = local_now
            .with_second(0)?
            .checked_add_signed(TimeDelta::minutes(1))?;
        for _ in 0..MAX_PASSED_CANDIDATES {
            let candidate = self.next_local_match(from)?;
            let fire = first_instant_showing(tz, candidate)?;
            if fire > after {
                return fire.checked_mul(1000);
            }
            // Shown before `after` (we are in the repeated part of an overlap): skip it.
            from = candidate.checked_add_signed(TimeDelta::minutes(1))?;
        }
        None
    }

    /// The first matching wall-clock minute at or after `start` (whose seconds are ignored),
    /// up to year 9999.
    fn next_local_match(&self, start: NaiveDateTime) -> Option<NaiveDateTime> {
        let (mut year, mut month) = (start.year(), start.month());
        let (mut day, mut hour, mut minute) = (start.day(), start.hour(), start.minute());
        let first_month = next_set_bit(self.months, 1)?;

        for _ in 0..MAX_MONTHS_SCANNED {
            if year > MAX_YEAR {
                return None;
            }
            if self.months & (1 << month) != 0 {
                if let Some((d, h, m)) = self.first_in_month(year, month, day, hour, minute) {
                    return NaiveDate::from_ymd_opt(year, month, d)?.and_hms_opt(h, m, 0);
                }
            }
            // Jump to the first minute of the next selected month.
            match next_set_bit(self.months, month + 1) {
                Some(next) => month = next,
                None => {
                    year += 1;
                    month = first_month;
                }
            }
            day = 1;
            hour = 0;
            minute = 0;
        }
        None
    }

    /// The expression as given, trimmed (for display / storage).
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// Earliest matching (day, hour, minute) in the given month at or after
    /// (`day`, `hour`, `minute`), if any.
    fn first_in_month(
        &self,
        year: i32,
        month: u32,
        day: u32,
        hour: u32,
        minute: u32,
    ) -> Option<(u32, u32, u32)> {
        let first_weekday = NaiveDate::from_ymd_opt(year, month, 1)?
            .weekday()
            .num_days_from_sunday();
        for d in day..=days_in_month(year, month) {
            if !self.day_matches(d, (first_weekday + d - 1) % 7) {
                continue;
            }
            let same_day = d == day;
            let mut h = if same_day { hour } else { 0 };
            while let Some(found_hour) = next_set_bit(self.hours, h) {
                let from_minute = if same_day && found_hour == hour {
                    minute
                } else {
                    0
                };
                if let Some(found_minute) = next_set_bit(self.minutes, from_minute) {
                    return Some((d, found_hour, found_minute));
                }
                h = found_hour + 1;
            }
        }
        None
    }

    fn day_matches(&self, day_of_month: u32, weekday: u32) -> bool {
        let dom_ok = self.days_of_month & (1 << day_of_month) != 0;
        let dow_ok = self.days_of_week & (1 << weekday) != 0;
        if self.dom_star || self.dow_star {
            dom_ok && dow_ok
        } else {
            dom_ok || dow_ok
        }
    }
}

impl FromStr for CronSchedule {
    type Err = CronError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CronSchedule::parse(s)
    }
}

impl fmt::Display for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expr)
    }
}

/// The first instant (seconds since the epoch) at which the clock of `tz` shows `local` or a
/// later time: the only instant of an ordinary time, the earlier instant of a time repeated by
/// a fall-back overlap, and the end of the gap for a time skipped by a spring-forward gap.
fn first_instant_showing(tz: Tz, local: NaiveDateTime) -> Option<i64> {
    match tz.from_local_datetime(&local) {
        MappedLocalTime::Single(t) => Some(t.timestamp()),
        MappedLocalTime::Ambiguous(a, b) => Some(a.timestamp().min(b.timestamp())),
        MappedLocalTime::None => {
            let gap = GapInfo::new(&local, &tz)?;
            match gap.begin {
                // The gap starts where the clock, still on the old offset, reaches `begin`;
                // that instant is the transition, the first one after the gap.
                Some((begin, offset_before)) => begin
                    .checked_sub_offset(offset_before.fix())
                    .map(|t| t.and_utc().timestamp()),
                None => gap.end.map(|t| t.timestamp()),
            }
        }
    }
}

fn expand_macro(trimmed: &str) -> Result<&'static str, CronError> {
    let name = trimmed.to_ascii_lowercase();
    Ok(match name.as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        "@reboot" => {
            return Err(CronError::RebootNotSupported {
                expr: trimmed.to_string(),
            })
        }
        _ => {
            return Err(CronError::UnknownMacro {
                expr: trimmed.to_string(),
            })
        }
    })
}

/// Lowest set bit of `bits` at position `from` or above.
fn next_set_bit(bits: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let masked = bits & (u64::MAX << from);
    (masked != 0).then(|| masked.trailing_zeros())
}

fn is_leap_year(year: i32) -> bool {
    year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0)
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Parses one field into a bitset (bit `n` = value `n`); day-of-week 7 is folded into 0.
fn parse_field(text: &str, field: CronField) -> Result<u64, FieldProblem> {
    let mut bits = 0u64;
    for item in text.split(',') {
        bits |= parse_item(item, field)?;
    }
    if field == CronField::DayOfWeek && bits & (1 << 7) != 0 {
        bits = (bits | 1) & !(1 << 7);
    }
    Ok(bits)
}

fn parse_item(item: &str, field: CronField) -> Result<u64, FieldProblem> {
    if item.is_empty() {
        return Err(FieldProblem::EmptyItem);
    }
    if item.contains('?') {
        return Err(FieldProblem::QuestionMark);
    }
    if let Some(ch) = item
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '*' | '/' | '-')))
    {
        return Err(FieldProblem::InvalidCharacter(ch));
    }
    let malformed = || FieldProblem::Malformed(item.to_string());

    let (base, step) = match item.split_once('/') {
        None => (item, None),
        Some((base, step)) => {
            if step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed());
            }
            let step = parse_number(step)?;
            if step == 0 {
                return Err(FieldProblem::ZeroStep);
            }
            if step > field.max() {
                return Err(FieldProblem::StepTooLarge(step));
            }
            (base, Some(step))
        }
    };

    let (low, high) = if base == "*" {
        (field.min(), field.wildcard_max())
    } else if let Some((a, b)) = base.split_once('-') {
        let low = parse_value(a, field, item)?;
        let mut high = parse_value(b, field, item)?;
        // Allow ranges ending on Sunday by name, e.g. FRI-SUN.
        if field == CronField::DayOfWeek
            && high == 0
            && low > 0
            && b.bytes().all(|c| c.is_ascii_alphabetic())
        {
            high = 7;
        }
        if low > high {
            return Err(FieldProblem::ReversedRange(base.to_string()));
        }
        (low, high)
    } else {
        let value = parse_value(base, field, item)?;
        match step {
            Some(_) => (value, field.wildcard_max().max(value)),
            None => (value, value),
        }
    };

    let step = step.unwrap_or(1);
    let mut bits = 0u64;
    let mut value = low;
    while value <= high {
        bits |= 1 << value;
        value += step;
    }
    Ok(bits)
}

/// Parses a single value: a number or (for month / day of week) a three-letter name.
fn parse_value(token: &str, field: CronField, item: &str) -> Result<u32, FieldProblem> {
    if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) {
        let value = parse_number(token)?;
        if value < field.min() || value > field.max() {
            return Err(FieldProblem::OutOfRange(value));
        }
        Ok(value)
    } else if !token.is_empty() && token.bytes().all(|b| b.is_ascii_alphabetic()) {
        field
            .lookup_name(token)
            .ok_or_else(|| FieldProblem::UnknownName(token.to_string()))
    } else {
        Err(FieldProblem::Malformed(item.to_string()))
    }
}

/// Parses a non-empty string of ASCII digits, rejecting values that overflow `u32`.
fn parse_number(digits: &str) -> Result<u32, FieldProblem> {
    digits
        .bytes()
        .try_fold(0u32, |acc, b| {
            acc.checked_mul(10)?.checked_add(u32::from(b - b'0'))
        })
        .ok_or_else(|| FieldProblem::NumberTooLarge(digits.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn ms(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        NaiveDate::from_ymd_opt(y, mo, d)
            .unwrap()
            .and_hms_opt(h, mi, 0)
            .unwrap()
            .and_utc()
            .timestamp_millis()
    }

    fn next(expr: &str, after: i64) -> Option<i64> {
        CronSchedule::parse(expr).unwrap().next_after(after)
    }

    /// The successive fire times after `after`.
    fn fires(expr: &str, after: i64, count: usize) -> Vec<i64> {
        let schedule = CronSchedule::parse(expr).unwrap();
        let mut out = Vec::new();
        let mut t = after;
        for _ in 0..count {
            t = schedule.next_after(t).unwrap();
            out.push(t);
        }
        out
    }

    fn err(expr: &str) -> CronError {
        CronSchedule::parse(expr).unwrap_err()
    }

    // ---- hand-checked examples ----

    #[test]
    fn every_minute_rounds_up_to_next_whole_minute() {
        let noon = ms(2024, 5, 1, 12, 0);
        assert_eq!(next("* * * * *", noon), Some(noon + 60_000));
        assert_eq!(next("* * * * *", noon + 30_500), Some(noon + 60_000));
        assert_eq!(next("* * * * *", noon + 59_999), Some(noon + 60_000));
        assert_eq!(next("* * * * *", noon - 1), Some(noon));
    }

    #[test]
    fn every_fifteen_minutes() {
        assert_eq!(
            next("*/15 * * * *", ms(2024, 5, 1, 12, 7)),
            Some(ms(2024, 5, 1, 12, 15))
        );
        assert_eq!(
            next("*/15 * * * *", ms(2024, 5, 1, 12, 45)),
            Some(ms(2024, 5, 1, 13, 0))
        );
        assert_eq!(
            next("*/15 * * * *", ms(2024, 5, 1, 23, 50)),
            Some(ms(2024, 5, 2, 0, 0))
        );
    }

    #[test]
    fn weekdays_at_nine() {
        // 2024-05-03 is a Friday, 2024-05-06 a Monday.
        let e = "0 9 * * MON-FRI";
        assert_eq!(next(e, ms(2024, 5, 3, 8, 0)), Some(ms(2024, 5, 3, 9, 0)));
        assert_eq!(next(e, ms(2024, 5, 3, 9, 0)), Some(ms(2024, 5, 6, 9, 0)));
        assert_eq!(
            next("0 9 * * mon-fri", ms(2024, 5, 4, 0, 0)),
            Some(ms(2024, 5, 6, 9, 0))
        );
    }

    #[test]
    fn first_of_month_at_two_thirty() {
        let e = "30 2 1 * *";
        assert_eq!(next(e, ms(2024, 1, 15, 0, 0)), Some(ms(2024, 2, 1, 2, 30)));
        assert_eq!(next(e, ms(2024, 2, 1, 2, 30)), Some(ms(2024, 3, 1, 2, 30)));
        assert_eq!(next(e, ms(2024, 2, 1, 2, 29)), Some(ms(2024, 2, 1, 2, 30)));
    }

    #[test]
    fn new_year_by_month_name() {
        assert_eq!(
            next("0 0 1 JAN *", ms(2024, 6, 1, 0, 0)),
            Some(ms(2025, 1, 1, 0, 0))
        );
        assert_eq!(
            next("0 0 1 jan *", ms(2024, 12, 31, 23, 59)),
            Some(ms(2025, 1, 1, 0, 0))
        );
    }

    #[test]
    fn hourly_macro() {
        let t = ms(2024, 5, 1, 10, 59) + 59_999;
        assert_eq!(next("@hourly", t), Some(ms(2024, 5, 1, 11, 0)));
        assert_eq!(
            next("@HOURLY", ms(2024, 5, 1, 11, 0)),
            Some(ms(2024, 5, 1, 12, 0))
        );
    }

    #[test]
    fn macros_expand_to_their_five_field_forms() {
        let same = |a: &str, b: &str| {
            let (x, y) = (
                CronSchedule::parse(a).unwrap(),
                CronSchedule::parse(b).unwrap(),
            );
            assert_eq!(
                (
                    x.minutes,
                    x.hours,
                    x.days_of_month,
                    x.months,
                    x.days_of_week,
                    x.dom_star,
                    x.dow_star
                ),
                (
                    y.minutes,
                    y.hours,
                    y.days_of_month,
                    y.months,
                    y.days_of_week,
                    y.dom_star,
                    y.dow_star
                ),
                "{a} vs {b}"
            );
        };
        same("@yearly", "0 0 1 1 *");
        same("@annually", "0 0 1 1 *");
        same("@monthly", "0 0 1 * *");
        same("@Weekly", "0 0 * * 0");
        same("@daily", "0 0 * * *");
        same("@midnight", "0 0 * * *");
        same("@hourly", "0 * * * *");
        assert_eq!(CronSchedule::parse("  @daily ").unwrap().expr(), "@daily");
    }

    #[test]
    fn dom_and_dow_both_restricted_means_either() {
        // May 2024: Fridays are 3, 10, 17, 24, 31; the 13th is a Monday.
        let got = fires("0 0 13 * FRI", ms(2024, 5, 1, 0, 0), 6);
        let want: Vec<i64> = [(5, 3), (5, 10), (5, 13), (5, 17), (5, 24), (5, 31)]
            .iter()
            .map(|&(mo, d)| ms(2024, mo, d, 0, 0))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn star_in_either_day_field_means_both_must_match() {
        // Only the other field constrains when one is `*`.
        assert_eq!(
            next("0 0 13 * *", ms(2024, 5, 1, 0, 0)),
            Some(ms(2024, 5, 13, 0, 0))
        );
        assert_eq!(
            next("0 0 * * FRI", ms(2024, 5, 4, 0, 0)),
            Some(ms(2024, 5, 10, 0, 0))
        );
        // Vixie rule: a field starting with `*` (here `*/2`) counts as unrestricted, so the
        // day must be both odd and a Monday. 2024-05-06 (Mon) is even; 2024-05-13 (Mon) odd.
        assert_eq!(
            next("0 0 */2 * MON", ms(2024, 5, 1, 0, 0)),
            Some(ms(2024, 5, 13, 0, 0))
        );
    }

    #[test]
    fn day_of_week_seven_is_sunday() {
        // 2024-05-05 is a Sunday.
        assert_eq!(
            next("0 12 * * 7", ms(2024, 5, 1, 0, 0)),
            Some(ms(2024, 5, 5, 12, 0))
        );
        assert_eq!(
            next("0 12 * * SUN", ms(2024, 5, 1, 0, 0)),
            Some(ms(2024, 5, 5, 12, 0))
        );
        let seven = CronSchedule::parse("0 12 * * 7").unwrap();
        let zero = CronSchedule::parse("0 12 * * 0").unwrap();
        assert_eq!(seven.days_of_week, zero.days_of_week);
        // FRI-SUN ends on Sunday; 5-7 likewise.
        assert_eq!(
            CronSchedule::parse("0 0 * * FRI-SUN").unwrap().days_of_week,
            0b110_0001
        );
        assert_eq!(
            CronSchedule::parse("0 0 * * 5-7").unwrap().days_of_week,
            0b110_0001
        );
    }

    #[test]
    fn leap_day() {
        assert_eq!(
            next("0 0 29 2 *", ms(2025, 3, 1, 0, 0)),
            Some(ms(2028, 2, 29, 0, 0))
        );
        // 2100 is not a leap year.
        assert_eq!(
            next("0 0 29 2 *", ms(2096, 3, 1, 0, 0)),
            Some(ms(2104, 2, 29, 0, 0))
        );
        // Feb 29 that is also a Sunday (`*/7` counts as `*`, so both must match):
        // 2004, 2032, 2060, ...
        assert_eq!(
            next("0 0 29 2 */7", ms(2004, 3, 1, 0, 0)),
            Some(ms(2032, 2, 29, 0, 0))
        );
    }

    #[test]
    fn never_firing_expressions_return_none_quickly() {
        let started = Instant::now();
        assert_eq!(next("0 0 30 2 *", ms(2024, 1, 1, 0, 0)), None);
        assert_eq!(next("0 0 31 4,6,9,11 *", 0), None);
        assert_eq!(next("0 0 31 FEB */7", i64::MIN / 2), None);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn year_boundary() {
        assert_eq!(
            next("59 23 31 12 *", ms(2024, 12, 31, 23, 59)),
            Some(ms(2025, 12, 31, 23, 59))
        );
        assert_eq!(
            next("0 0 * * *", ms(2024, 12, 31, 23, 59) + 30_000),
            Some(ms(2025, 1, 1, 0, 0))
        );
    }

    #[test]
    fn open_step_form() {
        let e = "10/20 * * * *";
        let got = fires(e, ms(2024, 5, 1, 12, 0), 4);
        let want = vec![
            ms(2024, 5, 1, 12, 10),
            ms(2024, 5, 1, 12, 30),
            ms(2024, 5, 1, 12, 50),
            ms(2024, 5, 1, 13, 10),
        ];
        assert_eq!(got, want);
        // Day of week `a/n` runs to Saturday: Mon, Wed, Fri.
        assert_eq!(
            CronSchedule::parse("0 0 * * 1/2").unwrap().days_of_week,
            0b010_1010
        );
    }

    #[test]
    fn lists_with_ranges_and_steps() {
        let s = CronSchedule::parse("0-10/5,30,45-47 8-10,22 * JAN-MAR,dec/1 *").unwrap();
        let bits = |v: &[u32]| v.iter().fold(0u64, |b, &x| b | 1 << x);
        assert_eq!(s.minutes, bits(&[0, 5, 10, 30, 45, 46, 47]));
        assert_eq!(s.hours, bits(&[8, 9, 10, 22]));
        assert_eq!(s.months, bits(&[1, 2, 3, 12]));
        assert_eq!(
            fires("0-10/5,30 * * * *", ms(2024, 5, 1, 12, 0), 4),
            vec![
                ms(2024, 5, 1, 12, 5),
                ms(2024, 5, 1, 12, 10),
                ms(2024, 5, 1, 12, 30),
                ms(2024, 5, 1, 13, 0),
            ]
        );
    }

    #[test]
    fn extreme_and_pre_epoch_times() {
        let s = CronSchedule::parse("0 0 1 1 *").unwrap();
        assert_eq!(s.next_after(-1), Some(0));
        assert_eq!(
            s.next_after(ms(1900, 6, 1, 0, 0)),
            Some(ms(1901, 1, 1, 0, 0))
        );
        assert_eq!(s.next_after(ms(9999, 1, 1, 0, 0)), None);
        assert_eq!(
            s.next_after(ms(9998, 6, 1, 0, 0)),
            Some(ms(9999, 1, 1, 0, 0))
        );
        for t in [i64::MIN, i64::MIN + 1, i64::MAX, i64::MAX - 1, -1, 0] {
            let _ = s.next_after(t);
            let _ = CronSchedule::parse("* * * * *").unwrap().next_after(t);
        }
        assert_eq!(s.next_after(i64::MAX), None);
        assert_eq!(s.next_after(i64::MIN), None);
    }

    #[test]
    fn expr_display_and_from_str() {
        let s: CronSchedule = "  */5 * * * *\n".parse().unwrap();
        assert_eq!(s.expr(), "*/5 * * * *");
        assert_eq!(s.to_string(), "*/5 * * * *");
        assert!("nope".parse::<CronSchedule>().is_err());
        // Tabs and repeated spaces separate fields too.
        assert!(CronSchedule::parse("0\t0  *  * *").is_ok());
    }

    // ---- time zones ----

    fn zone(name: &str) -> Tz {
        parse_time_zone(name).unwrap()
    }

    fn next_in(expr: &str, tz: Tz, after: i64) -> Option<i64> {
        CronSchedule::parse(expr).unwrap().next_after_in(after, tz)
    }

    /// The successive fire times in `tz` after `after`, checking they strictly increase.
    fn fires_in(expr: &str, tz: Tz, after: i64, count: usize) -> Vec<i64> {
        let schedule = CronSchedule::parse(expr).unwrap();
        let mut out = Vec::new();
        let mut t = after;
        for _ in 0..count {
            let next = schedule.next_after_in(t, tz).unwrap();
            assert!(next > t, "{expr} in {tz}: {next} after {t}");
            out.push(next);
            t = next;
        }
        out
    }

    /// Fire times given as UTC (y, mo, d, h, mi) tuples.
    fn utc(times: &[(i32, u32, u32, u32, u32)]) -> Vec<i64> {
        times
            .iter()
            .map(|&(y, mo, d, h, mi)| ms(y, mo, d, h, mi))
            .collect()
    }

    #[test]
    fn berlin_spring_forward_gap_fires_at_end_of_gap() {
        // 2024-03-31: 02:00 CET -> 03:00 CEST at 01:00Z; 02:30 does not exist that day.
        let berlin = zone("Europe/Berlin");
        assert_eq!(
            fires_in("30 2 * * *", berlin, ms(2024, 3, 29, 12, 0), 4),
            utc(&[
                (2024, 3, 30, 1, 30), // 02:30 CET
                (2024, 3, 31, 1, 0),  // 03:00 CEST, the first instant after the gap
                (2024, 4, 1, 0, 30),  // 02:30 CEST
                (2024, 4, 2, 0, 30),
            ])
        );
        let e = "30 2 * * *";
        assert_eq!(
            next_in(e, berlin, ms(2024, 3, 31, 0, 59)),
            Some(ms(2024, 3, 31, 1, 0))
        );
        assert_eq!(
            next_in(e, berlin, ms(2024, 3, 31, 1, 0) - 1),
            Some(ms(2024, 3, 31, 1, 0))
        );
        assert_eq!(
            next_in(e, berlin, ms(2024, 3, 31, 1, 0)),
            Some(ms(2024, 4, 1, 0, 30))
        );
    }

    #[test]
    fn berlin_gap_with_several_matches_fires_once() {
        let berlin = zone("Europe/Berlin");
        // 02:00, 02:15, 02:30 and 02:45 all fall in the gap: one fire at 03:00 CEST, then
        // the next day's 02:00 CEST.
        assert_eq!(
            fires_in("*/15 2 * * *", berlin, ms(2024, 3, 30, 2, 0), 4),
            utc(&[
                (2024, 3, 31, 1, 0),
                (2024, 4, 1, 0, 0),
                (2024, 4, 1, 0, 15),
                (2024, 4, 1, 0, 30),
            ])
        );
        // 03:00 matching as well is still one fire.
        assert_eq!(
            fires_in("0,30 2-3 * * *", berlin, ms(2024, 3, 31, 0, 0), 3),
            utc(&[
                (2024, 3, 31, 1, 0),
                (2024, 3, 31, 1, 30),
                (2024, 4, 1, 0, 0)
            ])
        );
        // Every minute: 01:59 CET, then 03:00 CEST once, then on.
        assert_eq!(
            fires_in("* * * * *", berlin, ms(2024, 3, 31, 0, 58), 3),
            utc(&[
                (2024, 3, 31, 0, 59),
                (2024, 3, 31, 1, 0),
                (2024, 3, 31, 1, 1)
            ])
        );
    }

    #[test]
    fn berlin_fall_back_overlap_fires_earlier_instant_only() {
        // 2024-10-27: 03:00 CEST -> 02:00 CET at 01:00Z; 02:30 occurs at 00:30Z and 01:30Z.
        let berlin = zone("Europe/Berlin");
        let e = "30 2 * * *";
        assert_eq!(
            fires_in(e, berlin, ms(2024, 10, 26, 12, 0), 2),
            utc(&[(2024, 10, 27, 0, 30), (2024, 10, 28, 1, 30)])
        );
        // From inside the repeated hour, or just before the second 02:30: the next day.
        for after in [
            ms(2024, 10, 27, 0, 30),
            ms(2024, 10, 27, 1, 0),
            ms(2024, 10, 27, 1, 10),
            ms(2024, 10, 27, 1, 30) - 1,
            ms(2024, 10, 27, 1, 30),
        ] {
            assert_eq!(next_in(e, berlin, after), Some(ms(2024, 10, 28, 1, 30)));
        }
        // Every 15 minutes in hour 2: four fires in the first pass, none in the second.
        assert_eq!(
            fires_in("*/15 2 * * *", berlin, ms(2024, 10, 26, 23, 0), 5),
            utc(&[
                (2024, 10, 27, 0, 0),
                (2024, 10, 27, 0, 15),
                (2024, 10, 27, 0, 30),
                (2024, 10, 27, 0, 45),
                (2024, 10, 28, 1, 0),
            ])
        );
        // Every minute: 02:59 CEST, then 03:00 CET an hour later.
        assert_eq!(
            fires_in("* * * * *", berlin, ms(2024, 10, 27, 0, 58), 2),
            utc(&[(2024, 10, 27, 0, 59), (2024, 10, 27, 2, 0)])
        );
    }

    #[test]
    fn new_york_weekdays_at_nine_across_dst_changes() {
        let new_york = zone("America/New_York");
        let e = "0 9 * * MON-FRI";
        // 2024-03-10 (Sunday): EST -> EDT.
        assert_eq!(
            fires_in(e, new_york, ms(2024, 3, 8, 0, 0), 3),
            utc(&[
                (2024, 3, 8, 14, 0),
                (2024, 3, 11, 13, 0),
                (2024, 3, 12, 13, 0)
            ])
        );
        // 2024-11-03 (Sunday): EDT -> EST.
        assert_eq!(
            fires_in(e, new_york, ms(2024, 11, 1, 0, 0), 2),
            utc(&[(2024, 11, 1, 13, 0), (2024, 11, 4, 14, 0)])
        );
    }

    #[test]
    fn non_hour_offsets() {
        assert_eq!(
            fires_in("0 0 * * *", zone("Asia/Kathmandu"), ms(2024, 5, 1, 0, 0), 2),
            utc(&[(2024, 5, 1, 18, 15), (2024, 5, 2, 18, 15)])
        );
        assert_eq!(
            next_in("30 9 * * *", zone("Asia/Kolkata"), ms(2024, 5, 1, 0, 0)),
            Some(ms(2024, 5, 1, 4, 0))
        );
        // +05:45 local 00:00 on a Saturday is Friday 18:15Z.
        assert_eq!(
            next_in("0 0 * * SAT", zone("Asia/Kathmandu"), ms(2024, 5, 1, 0, 0)),
            Some(ms(2024, 5, 3, 18, 15))
        );
    }

    #[test]
    fn lord_howe_half_hour_dst() {
        let lord_howe = zone("Australia/Lord_Howe");
        // 2024-04-07 02:00 +11:00 -> 01:30 +10:30 at 2024-04-06 15:00Z: 01:30-01:59 repeats.
        assert_eq!(
            fires_in("45 1 * * *", lord_howe, ms(2024, 4, 5, 0, 0), 3),
            utc(&[
                (2024, 4, 5, 14, 45), // 04-06 01:45 +11:00
                (2024, 4, 6, 14, 45), // 04-07 01:45 +11:00; not again at 15:15Z (+10:30)
                (2024, 4, 7, 15, 15), // 04-08 01:45 +10:30
            ])
        );
        // 2024-10-06 02:00 +10:30 -> 02:30 +11:00 at 2024-10-05 15:30Z: 02:15 is skipped.
        assert_eq!(
            fires_in("15 2 * * *", lord_howe, ms(2024, 10, 4, 0, 0), 3),
            utc(&[
                (2024, 10, 4, 15, 45), // 10-05 02:15 +10:30
                (2024, 10, 5, 15, 30), // 10-06 02:30 +11:00, the end of the gap
                (2024, 10, 6, 15, 15), // 10-07 02:15 +11:00
            ])
        );
    }

    #[test]
    fn samoa_skipped_day_fires_at_its_end() {
        // Pacific/Apia skipped 2011-12-30 entirely (-10:00 -> +14:00 at 2011-12-30 10:00Z).
        assert_eq!(
            fires_in(
                "0 12 * * *",
                zone("Pacific/Apia"),
                ms(2011, 12, 29, 0, 0),
                3
            ),
            utc(&[
                (2011, 12, 29, 22, 0), // 12-29 12:00 -10:00
                (2011, 12, 30, 10, 0), // 12-30 12:00 does not exist: 12-31 00:00 +14:00
                (2011, 12, 30, 22, 0), // 12-31 12:00 +14:00
            ])
        );
    }

    #[test]
    fn historical_offsets_with_seconds() {
        // Liberia used -00:44:30 until 1972-01-07 (then UTC): 09:00 local is 09:44:30Z.
        let monrovia = zone("Africa/Monrovia");
        let nine = ms(1971, 6, 1, 9, 44) + 30_000;
        assert_eq!(
            next_in("0 9 * * *", monrovia, ms(1971, 6, 1, 0, 0)),
            Some(nine)
        );
        assert_eq!(
            next_in("0 9 * * *", monrovia, nine),
            Some(nine + 86_400_000)
        );
        assert_eq!(
            next_in("0 9 * * *", monrovia, ms(1972, 6, 1, 0, 0)),
            Some(ms(1972, 6, 1, 9, 0))
        );
    }

    #[test]
    fn utc_zone_equals_next_after() {
        let exprs = [
            "* * * * *",
            "*/7 3-5 * * *",
            "30 2 * * *",
            "0 0 13 * FRI",
            "0 0 29 2 *",
            "0 0 30 2 *",
            "59 23 31 12 *",
        ];
        let times = [
            i64::MIN,
            i64::MIN + 1,
            -1,
            0,
            ms(1900, 6, 1, 0, 0),
            ms(2024, 3, 31, 1, 30) + 123,
            ms(9998, 6, 1, 0, 0),
            ms(9999, 12, 31, 23, 59),
            i64::MAX - 1,
            i64::MAX,
        ];
        for expr in exprs {
            let s = CronSchedule::parse(expr).unwrap();
            for t in times {
                assert_eq!(s.next_after_in(t, Tz::UTC), s.next_after(t), "{expr} {t}");
                assert_eq!(
                    s.next_after_in(t, zone("Etc/UTC")),
                    s.next_after(t),
                    "{expr} {t}"
                );
            }
        }
    }

    #[test]
    fn zones_at_extreme_times() {
        let zones = [
            "Europe/Berlin",
            "Pacific/Kiritimati",
            "Etc/GMT+12",
            "Australia/Lord_Howe",
            "America/Sitka",
        ];
        let times = [
            i64::MIN,
            i64::MIN + 1,
            i64::MIN / 2,
            -8_334_000_000_000_000, // around year -262000, near chrono's lower limit
            -1,
            0,
            ms(9999, 12, 31, 23, 59),
            8_210_000_000_000_000, // around year 262000, near chrono's upper limit
            i64::MAX - 1,
            i64::MAX,
        ];
        let started = Instant::now();
        for name in zones {
            let tz = zone(name);
            for expr in ["* * * * *", "0 0 1 1 *", "0 0 30 2 *", "59 23 31 12 *"] {
                let s = CronSchedule::parse(expr).unwrap();
                for t in times {
                    if let Some(g) = s.next_after_in(t, tz) {
                        assert!(g > t, "{expr} {name} {t}");
                    }
                }
                assert_eq!(s.next_after_in(i64::MAX, tz), None);
                assert_eq!(s.next_after_in(i64::MIN, tz), None);
            }
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        // The year limit applies to local time: 9999-01-01 00:00 CET is 9998-12-31 23:00Z.
        let yearly = CronSchedule::parse("0 0 1 1 *").unwrap();
        let berlin = zone("Europe/Berlin");
        assert_eq!(
            yearly.next_after_in(ms(9998, 6, 1, 0, 0), berlin),
            Some(ms(9998, 12, 31, 23, 0))
        );
        assert_eq!(yearly.next_after_in(ms(9998, 12, 31, 23, 0), berlin), None);
    }

    #[test]
    fn sitka_day_long_overlap_is_skipped() {
        // 1867-10-19 00:31:13Z: Sitka went from +14:58:47 to -09:01:13 (Alaska purchase), so
        // the clock fell back by a whole day and that day's hours were shown twice.
        let sitka = zone("America/Sitka");
        let transition = ms(1867, 10, 19, 0, 31) + 13_000;
        // Local 15:30 on 10-19 became 15:30 on 10-18 again.
        let hourly = CronSchedule::parse("0 * * * *").unwrap();
        let last_before = hourly.next_after_in(transition - 3_600_000, sitka).unwrap();
        // 10-19 15:00 local is the last fire before the change.
        assert_eq!(last_before, transition - 1_800_000);
        // The repeated day fires nothing; next is 10-19 16:00 at -09:01:13, 25 hours later.
        assert_eq!(
            hourly.next_after_in(last_before, sitka),
            Some(last_before + 25 * 3_600_000)
        );
        assert_eq!(
            hourly.next_after_in(transition - 1, sitka),
            Some(last_before + 25 * 3_600_000)
        );
        let started = Instant::now();
        let every_minute = CronSchedule::parse("* * * * *").unwrap();
        let next = every_minute.next_after_in(transition, sitka).unwrap();
        // Every minute up to 10-19 15:29 was shown before; 15:30 comes a day after the change.
        assert_eq!(next, transition + 24 * 3_600_000);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn parse_time_zone_accepts_iana_names() {
        assert_eq!(parse_time_zone("Europe/Berlin"), Ok(Tz::Europe__Berlin));
        assert_eq!(parse_time_zone("UTC"), Ok(Tz::UTC));
        assert_eq!(
            parse_time_zone("America/New_York"),
            Ok(Tz::America__New_York)
        );
        assert_eq!(parse_time_zone("Asia/Kathmandu"), Ok(Tz::Asia__Kathmandu));
        assert_eq!(
            parse_time_zone("America/Argentina/Buenos_Aires"),
            Ok(Tz::America__Argentina__Buenos_Aires)
        );
        assert_eq!(parse_time_zone("Etc/GMT+5"), Ok(Tz::Etc__GMTPlus5));
        assert_eq!(parse_time_zone("US/Eastern"), Ok(Tz::US__Eastern));
        assert_eq!(parse_time_zone(" Europe/Berlin\n"), Ok(Tz::Europe__Berlin));
        assert_eq!(Tz::Europe__Berlin.name(), "Europe/Berlin");
    }

    #[test]
    fn parse_time_zone_ignores_case_as_a_fallback() {
        assert_eq!(parse_time_zone("europe/berlin"), Ok(Tz::Europe__Berlin));
        assert_eq!(parse_time_zone("EUROPE/BERLIN"), Ok(Tz::Europe__Berlin));
        assert_eq!(parse_time_zone("utc"), Ok(Tz::UTC));
        assert_eq!(
            parse_time_zone("america/new_york"),
            Ok(Tz::America__New_York)
        );
        assert_eq!(parse_time_zone("etc/gmt-14"), Ok(Tz::Etc__GMTMinus14));
        // No two IANA names differ only in case, so the fallback is unambiguous.
        let mut lower: Vec<String> = chrono_tz::TZ_VARIANTS
            .iter()
            .map(|tz| tz.name().to_ascii_lowercase())
            .collect();
        let total = lower.len();
        lower.sort();
        lower.dedup();
        assert_eq!(lower.len(), total);
        for tz in chrono_tz::TZ_VARIANTS {
            assert_eq!(parse_time_zone(&tz.name().to_ascii_uppercase()), Ok(tz));
        }
    }

    #[test]
    fn parse_time_zone_rejects_unknown_names() {
        let e = parse_time_zone("Mars/Base").unwrap_err();
        assert_eq!(
            e,
            CronError::UnknownTimeZone {
                name: "Mars/Base".to_string()
            }
        );
        assert_eq!(
            e.to_string(),
            "time zone \"Mars/Base\": unknown (an IANA name such as \"Europe/Berlin\" or \"UTC\")"
        );
        for bad in [
            "",
            "  ",
            "Europe/Berlinn",
            "Europe/ Berlin",
            "Europe/Berlin/",
            "Berlin",
            "+05:30",
            "UTC+1",
            "Europe\\Berlin",
            "Europe/Berlin\0",
        ] {
            assert!(
                matches!(parse_time_zone(bad), Err(CronError::UnknownTimeZone { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn parse_time_zone_rejects_non_ascii_and_overlong_names() {
        assert_eq!(
            parse_time_zone("Europe/Zürich"),
            Err(CronError::UnknownTimeZone {
                name: "Europe/Zürich".to_string()
            })
        );
        assert!(parse_time_zone("Europe/Berlin\u{200b}").is_err());
        let at_limit = "A".repeat(MAX_TIME_ZONE_NAME_LEN);
        assert_eq!(
            parse_time_zone(&at_limit),
            Err(CronError::UnknownTimeZone {
                name: at_limit.clone()
            })
        );
        // Over the limit: rejected even if it would otherwise match, and cut in the message.
        let padded = format!("Europe/Berlin{}", " ".repeat(100));
        assert!(padded.len() > MAX_TIME_ZONE_NAME_LEN);
        assert_eq!(parse_time_zone(&padded), Ok(Tz::Europe__Berlin)); // whitespace is trimmed
        let long = "Europe/".repeat(100);
        match parse_time_zone(&long) {
            Err(CronError::UnknownTimeZone { name }) => {
                assert_eq!(name, format!("{}...", &long[..MAX_TIME_ZONE_NAME_LEN]));
            }
            other => panic!("{other:?}"),
        }
        let _ = parse_time_zone(&"ü".repeat(10_000));
    }

    // ---- errors: one per kind ----

    fn assert_mentions(e: &CronError, words: &[&str]) {
        let msg = e.to_string();
        for w in words {
            assert!(msg.contains(w), "{msg:?} should mention {w:?}");
        }
    }

    #[test]
    fn error_empty() {
        assert_eq!(err(""), CronError::Empty);
        assert_eq!(err("  \t "), CronError::Empty);
        assert_mentions(&err(""), &["empty"]);
    }

    #[test]
    fn error_wrong_field_count() {
        let e = err("* * * *");
        assert!(matches!(e, CronError::WrongFieldCount { found: 4, .. }));
        assert_mentions(&e, &["expected 5 fields", "found 4"]);
        assert!(matches!(
            err("* * * * * *"),
            CronError::WrongFieldCount { found: 6, .. }
        ));
    }

    #[test]
    fn error_out_of_range() {
        let e = err("60 * * * *");
        assert!(matches!(
            e,
            CronError::OutOfRange {
                value: 60,
                field: CronField::Minute,
                ..
            }
        ));
        assert_mentions(&e, &["minute", "60", "0-59"]);
        assert_mentions(&err("0 24 * * *"), &["hour", "0-23"]);
        assert_mentions(&err("0 0 0 * *"), &["day of month", "1-31"]);
        assert_mentions(&err("0 0 1 13 *"), &["month", "1-12"]);
        assert_mentions(&err("0 0 * * 8"), &["day of week", "0-7"]);
        assert_mentions(&err("0 0 1-32 * *"), &["day of month", "32"]);
    }

    #[test]
    fn error_reversed_range() {
        let e = err("0 10-5 * * *");
        assert!(matches!(
            e,
            CronError::ReversedRange {
                field: CronField::Hour,
                ..
            }
        ));
        assert_mentions(&e, &["hour", "10-5"]);
        assert_mentions(&err("0 0 * DEC-JAN *"), &["month", "DEC-JAN"]);
    }

    #[test]
    fn error_zero_step() {
        let e = err("*/0 * * * *");
        assert_eq!(
            e.to_string(),
            "cron expression \"*/0 * * * *\": minute: step must be at least 1"
        );
        assert!(matches!(
            err("0 0 1-10/0 * *"),
            CronError::ZeroStep {
                field: CronField::DayOfMonth,
                ..
            }
        ));
    }

    #[test]
    fn error_step_too_large() {
        let e = err("*/60 * * * *");
        assert!(matches!(
            e,
            CronError::StepTooLarge {
                step: 60,
                max: 59,
                ..
            }
        ));
        assert_mentions(&e, &["minute", "60", "59"]);
    }

    #[test]
    fn error_unknown_name() {
        let e = err("0 0 * JANUARY *");
        assert!(matches!(
            e,
            CronError::UnknownName {
                field: CronField::Month,
                ..
            }
        ));
        assert_mentions(&e, &["month", "JANUARY", "JAN-DEC"]);
        assert_mentions(&err("0 0 * * FUN"), &["day of week", "FUN", "SUN-SAT"]);
        // Names are only valid in month and day of week.
        assert_mentions(&err("MON 0 * * *"), &["minute", "MON", "numbers only"]);
    }

    #[test]
    fn error_question_mark() {
        let e = err("0 0 ? * MON");
        assert!(matches!(
            e,
            CronError::QuestionMarkNotSupported {
                field: CronField::DayOfMonth,
                ..
            }
        ));
        assert_mentions(&e, &["day of month", "'?' is not supported"]);
    }

    #[test]
    fn error_garbage_characters() {
        let e = err("0 0 * * 5#3");
        assert!(matches!(
            e,
            CronError::InvalidCharacter {
                ch: '#',
                field: CronField::DayOfWeek,
                ..
            }
        ));
        assert_mentions(&e, &["day of week", "'#'"]);
        assert_mentions(&err("1.5 * * * *"), &["minute", "'.'"]);
        assert_mentions(&err("* * * * * @"), &["expected 5 fields"]);
    }

    #[test]
    fn error_malformed_item() {
        for (expr, field) in [
            ("1- * * * *", "minute"),
            ("* -1 * * *", "hour"),
            ("* * 1-2-3 * *", "day of month"),
            ("* * * 1/2/3 *", "month"),
            ("* * * * /5", "day of week"),
            ("*/ * * * *", "minute"),
            ("*/MON * * * *", "minute"),
            ("*-5 * * * *", "minute"),
            ("1a * * * *", "minute"),
            ("** * * * *", "minute"),
        ] {
            let e = err(expr);
            assert!(
                matches!(e, CronError::MalformedItem { .. }),
                "{expr}: {e:?}"
            );
            assert_mentions(&e, &[field, "malformed"]);
        }
    }

    #[test]
    fn error_empty_list_item() {
        for expr in ["1,,2 * * * *", "* 1, * * *", "* * ,1 * *"] {
            let e = err(expr);
            assert!(
                matches!(e, CronError::EmptyListItem { .. }),
                "{expr}: {e:?}"
            );
        }
        assert_mentions(&err("* 1, * * *"), &["hour", "empty item"]);
    }

    #[test]
    fn error_number_overflow() {
        let e = err("99999999999999999999 * * * *");
        assert!(matches!(
            e,
            CronError::NumberTooLarge {
                field: CronField::Minute,
                ..
            }
        ));
        assert_mentions(&e, &["minute", "99999999999999999999", "too large"]);
        assert_mentions(&err("* * * * */99999999999"), &["day of week", "too large"]);
        // Fits in u32 but out of range.
        assert_mentions(&err("* 4294967295 * * *"), &["hour", "out of range"]);
    }

    #[test]
    fn error_non_ascii() {
        let e = err("0 0 * * MÖN");
        assert_eq!(
            e,
            CronError::NonAscii {
                ch: 'Ö',
                position: 10
            }
        );
        assert_mentions(&e, &["non-ASCII", "'Ö'"]);
        assert!(matches!(
            err("\u{3000}* * * * *"),
            CronError::NonAscii { .. }
        ));
    }

    #[test]
    fn error_too_long() {
        let long = format!("* * * * {}", vec!["1"; 600].join(","));
        let e = err(&long);
        assert!(matches!(e, CronError::TooLong { len } if len == long.len()));
        assert_mentions(&e, &["too long", "1000"]);
        // Exactly at the limit is fine.
        let ok = format!("* * * * 1{}", ",1".repeat((MAX_CRON_EXPR_LEN - 9) / 2));
        assert!(ok.len() <= MAX_CRON_EXPR_LEN);
        assert!(CronSchedule::parse(&ok).is_ok());
    }

    #[test]
    fn error_macros() {
        let e = err("@reboot");
        assert!(matches!(e, CronError::RebootNotSupported { .. }));
        assert_mentions(&e, &["@reboot", "not supported"]);
        let e = err("@fortnightly");
        assert!(matches!(e, CronError::UnknownMacro { .. }));
        assert_mentions(&e, &["@fortnightly", "unknown macro", "@daily"]);
        assert!(matches!(err("@daily 5"), CronError::UnknownMacro { .. }));
    }

    // ---- property tests ----

    mod props {
        use super::*;
        use proptest::prelude::*;

        /// One comma-list item, in structured form.
        #[derive(Debug, Clone)]
        enum Item {
            Star,
            StarStep(u32),
            Value(u32),
            Range(u32, u32),
            RangeStep(u32, u32, u32),
            OpenStep(u32, u32),
        }

        fn item(field: CronField) -> impl Strategy<Value = Item> {
            let (lo, hi) = (field.min(), field.max());
            let steps = 1..=field.max();
            let ordered = (lo..=hi, lo..=hi).prop_map(|(a, b)| (a.min(b), a.max(b)));
            prop_oneof![
                4 => Just(Item::Star),
                1 => steps.clone().prop_map(Item::StarStep),
                3 => (lo..=hi).prop_map(Item::Value),
                2 => ordered.clone().prop_map(|(a, b)| Item::Range(a, b)),
                1 => (ordered, steps.clone()).prop_map(|((a, b), s)| Item::RangeStep(a, b, s)),
                1 => (lo..=hi, steps).prop_map(|(a, s)| Item::OpenStep(a, s)),
            ]
        }

        #[derive(Debug, Clone)]
        struct FieldSpec {
            field: CronField,
            items: Vec<Item>,
            names: bool,
        }

        fn field_spec(field: CronField) -> impl Strategy<Value = FieldSpec> {
            (prop::collection::vec(item(field), 1..=3), any::<bool>()).prop_map(
                move |(items, names)| FieldSpec {
                    field,
                    items,
                    names,
                },
            )
        }

        impl FieldSpec {
            fn value_text(&self, v: u32) -> String {
                match self.field {
                    CronField::Month if self.names => MONTH_NAMES[v as usize - 1].to_lowercase(),
                    CronField::DayOfWeek if self.names && v < 7 => {
                        DAY_NAMES[v as usize].to_string()
                    }
                    _ => v.to_string(),
                }
            }

            fn render(&self) -> String {
                let parts: Vec<String> = self
                    .items
                    .iter()
                    .map(|it| match *it {
                        Item::Star => "*".to_string(),
                        Item::StarStep(s) => format!("*/{s}"),
                        Item::Value(v) => self.value_text(v),
                        Item::Range(a, b) => {
                            format!("{}-{}", self.value_text(a), self.value_text(b))
                        }
                        Item::RangeStep(a, b, s) => {
                            format!("{}-{}/{s}", self.value_text(a), self.value_text(b))
                        }
                        Item::OpenStep(a, s) => format!("{}/{s}", self.value_text(a)),
                    })
                    .collect();
                parts.join(",")
            }

            /// The selected values, computed independently of the parser.
            fn values(&self) -> Vec<bool> {
                let wild_hi = if self.field == CronField::DayOfWeek {
                    6
                } else {
                    self.field.max()
                };
                let lo = self.field.min();
                let mut set = vec![false; 64];
                let mut add = |a: u32, b: u32, s: u32| {
                    for v in (a..=b).step_by(s as usize) {
                        set[v as usize] = true;
                    }
                };
                for it in &self.items {
                    match *it {
                        Item::Star => add(lo, wild_hi, 1),
                        Item::StarStep(s) => add(lo, wild_hi, s),
                        Item::Value(v) => add(v, v, 1),
                        Item::Range(a, b) => add(a, b, 1),
                        Item::RangeStep(a, b, s) => add(a, b, s),
                        Item::OpenStep(a, s) => add(a, wild_hi.max(a), s),
                    }
                }
                if self.field == CronField::DayOfWeek && set[7] {
                    set[0] = true;
                }
                set
            }

            fn starts_with_star(&self) -> bool {
                matches!(self.items[0], Item::Star | Item::StarStep(_))
            }
        }

        fn specs() -> impl Strategy<Value = [FieldSpec; 5]> {
            (
                field_spec(CronField::Minute),
                field_spec(CronField::Hour),
                field_spec(CronField::DayOfMonth),
                field_spec(CronField::Month),
                field_spec(CronField::DayOfWeek),
            )
                .prop_map(|(a, b, c, d, e)| [a, b, c, d, e])
        }

        /// Independent matcher for one minute, using chrono for the calendar.
        fn brute_matches(
            specs: &[FieldSpec; 5],
            sets: &[Vec<bool>],
            t: chrono::NaiveDateTime,
        ) -> bool {
            let dom_ok = sets[2][t.day() as usize];
            let dow_ok = sets[4][t.weekday().num_days_from_sunday() as usize];
            let day_ok = if specs[2].starts_with_star() || specs[4].starts_with_star() {
                dom_ok && dow_ok
            } else {
                dom_ok || dow_ok
            };
            sets[0][t.minute() as usize]
                && sets[1][t.hour() as usize]
                && sets[3][t.month() as usize]
                && day_ok
        }

        const BRUTE_MINUTES: i64 = 4 * 366 * 24 * 60;
        // 1970-01-01 .. 2200-01-01 in ms.
        const AFTER_MAX: i64 = 7_258_118_400_000;

        // ---- time-zone brute force ----

        const TZ_ZONES: [&str; 6] = [
            "Europe/Berlin",
            "America/New_York",
            "Australia/Lord_Howe",
            "America/Sao_Paulo",
            "Asia/Kolkata",
            "UTC",
        ];
        /// How many of `TZ_ZONES` (from the start) have DST transitions.
        const DST_ZONES: usize = 4;
        // 2000-01-01 .. 2040-01-01 in ms.
        const Y2000_MS: i64 = 946_684_800_000;
        const Y2040_MS: i64 = 2_208_988_800_000;
        const TZ_BRUTE_MINUTES: i64 = 2 * 366 * 24 * 60;

        /// A field that is just `*`.
        fn star(field: CronField) -> FieldSpec {
            FieldSpec {
                field,
                items: vec![Item::Star],
                names: false,
            }
        }

        /// Expressions that fire most days, so that fires land on transition days.
        fn daily_specs() -> impl Strategy<Value = [FieldSpec; 5]> {
            let mostly_star = |field| prop_oneof![3 => Just(star(field)), 1 => field_spec(field)];
            (
                field_spec(CronField::Minute),
                field_spec(CronField::Hour),
                mostly_star(CronField::DayOfMonth),
                mostly_star(CronField::Month),
                mostly_star(CronField::DayOfWeek),
            )
                .prop_map(|(a, b, c, d, e)| [a, b, c, d, e])
        }

        /// The wall-clock time in `tz` at the UTC instant `secs`, from the zone's UTC offset
        /// alone (no local-to-UTC conversion).
        fn wall_clock(tz: Tz, secs: i64) -> chrono::NaiveDateTime {
            let utc = DateTime::from_timestamp(secs, 0).unwrap().naive_utc();
            let offset = tz.offset_from_utc_datetime(&utc).fix().local_minus_utc();
            utc + chrono::TimeDelta::seconds(i64::from(offset))
        }

        /// Independent brute force for `next_after_in`: walks UTC instants `step` seconds apart
        /// (60 is exact when every offset and transition is a whole minute) from the first one
        /// after `after_ms`, for `steps` steps, and returns the first `count` fire times (ms).
        ///
        /// With H the latest wall-clock time shown before instant u and L(u) the time shown at
        /// u, u fires when some matching whole minute lies in (H, L(u)]:
        /// - ordinary minute: that interval is just L(u);
        /// - gap (the clock jumped forward): it also holds every skipped minute, so any number
        ///   of matches in the gap fire once, at the first instant after it;
        /// - overlap (the clock went back): L(u) <= H, the interval is empty, so a repeated
        ///   time fires only at its first instance.
        fn brute_fires(
            specs: &[FieldSpec; 5],
            sets: &[Vec<bool>],
            tz: Tz,
            after_ms: i64,
            step: i64,
            steps: i64,
            count: usize,
        ) -> Vec<i64> {
            let one_minute = chrono::TimeDelta::minutes(1);
            let first = (after_ms.div_euclid(1000).div_euclid(step) + 1) * step;
            // H before `first`: no overlap lasts two days.
            let mut high = (1..=2 * 86_400 / step)
                .map(|i| wall_clock(tz, first - i * step))
                .max()
                .unwrap();
            let mut out = Vec::new();
            for i in 0..steps {
                let u = first + i * step;
                let shown = wall_clock(tz, u);
                // Whole minutes in (high, shown].
                let mut m = high.with_second(0).unwrap() + one_minute;
                while m <= shown {
                    if brute_matches(specs, sets, m) {
                        out.push(u * 1000);
                        break;
                    }
                    m += one_minute;
                }
                high = high.max(shown);
                if out.len() == count {
                    break;
                }
            }
            out
        }

        /// Checks up to `count` successive `next_after_in` results against `brute_fires`.
        fn check_zone(
            specs: &[FieldSpec; 5],
            tz: Tz,
            after: i64,
            count: usize,
        ) -> Result<(), TestCaseError> {
            let expr = specs
                .iter()
                .map(FieldSpec::render)
                .collect::<Vec<_>>()
                .join(" ");
            let schedule = CronSchedule::parse(&expr).unwrap();
            let sets: Vec<Vec<bool>> = specs.iter().map(FieldSpec::values).collect();
            let want = brute_fires(specs, &sets, tz, after, 60, TZ_BRUTE_MINUTES, count);
            let horizon = (after.div_euclid(60_000) + 1 + TZ_BRUTE_MINUTES) * 60_000;
            let mut t = after;
            for i in 0..count {
                let got = schedule.next_after_in(t, tz);
                if let Some(g) = got {
                    prop_assert!(g > t, "{} in {}: {} after {}", expr, tz, g, t);
                    prop_assert_eq!(g % 60_000, 0);
                }
                match want.get(i) {
                    Some(&w) => prop_assert_eq!(
                        got,
                        Some(w),
                        "{} in {} after {}, fire {}",
                        expr,
                        tz,
                        after,
                        i
                    ),
                    None => {
                        if let Some(g) = got {
                            prop_assert!(g >= horizon, "{} in {} after {}: {}", expr, tz, t, g);
                        }
                        break;
                    }
                }
                t = want[i];
            }
            Ok(())
        }

        /// UTC hours (ms) in `year` at which the offset of `tz` differs from an hour before.
        fn transitions(tz: Tz, year: i32) -> Vec<i64> {
            let start = ms(year, 1, 1, 0, 0) / 1000;
            let offset = |secs: i64| {
                let utc = DateTime::from_timestamp(secs, 0).unwrap().naive_utc();
                tz.offset_from_utc_datetime(&utc).fix()
            };
            (1..366 * 24)
                .map(|h| start + h * 3600)
                .filter(|&t| offset(t) != offset(t - 3600))
                .map(|t| t * 1000)
                .collect()
        }

        #[test]
        fn brute_force_handles_seconds_offsets_and_day_long_changes() {
            // The brute force itself, stepping by seconds, agrees with the hand-checked
            // Sitka and Monrovia cases.
            let hourly = [
                star(CronField::Minute),
                star(CronField::Hour),
                star(CronField::DayOfMonth),
                star(CronField::Month),
                star(CronField::DayOfWeek),
            ];
            let mut hourly = hourly;
            hourly[0].items = vec![Item::Value(0)];
            let sets: Vec<Vec<bool>> = hourly.iter().map(FieldSpec::values).collect();
            let sitka = parse_time_zone("America/Sitka").unwrap();
            let after = ms(1867, 10, 18, 23, 40);
            let want = brute_fires(&hourly, &sets, sitka, after, 1, 2 * 86_400, 3);
            let schedule = CronSchedule::parse("0 * * * *").unwrap();
            let mut t = after;
            for w in want {
                t = schedule.next_after_in(t, sitka).unwrap();
                assert_eq!(t, w);
            }
            let monrovia = parse_time_zone("Africa/Monrovia").unwrap();
            let after = ms(1972, 1, 6, 20, 0);
            let want = brute_fires(&hourly, &sets, monrovia, after, 1, 86_400, 6);
            assert_eq!(want.len(), 6);
            let mut t = after;
            for w in want {
                t = schedule.next_after_in(t, monrovia).unwrap();
                assert_eq!(t, w);
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn next_after_matches_brute_force(specs in specs(), after in 0..AFTER_MAX) {
                let expr = specs.iter().map(FieldSpec::render).collect::<Vec<_>>().join(" ");
                let schedule = CronSchedule::parse(&expr).unwrap();
                let sets: Vec<Vec<bool>> = specs.iter().map(FieldSpec::values).collect();
                let bits = |set: &Vec<bool>| set.iter().enumerate().fold(0u64, |b, (i, &on)| if on { b | 1 << i } else { b });
                let dow_bits = bits(&sets[4]) & !(1 << 7);
                prop_assert_eq!(
                    [schedule.minutes, schedule.hours, schedule.days_of_month, schedule.months, schedule.days_of_week],
                    [bits(&sets[0]), bits(&sets[1]), bits(&sets[2]), bits(&sets[3]), dow_bits],
                    "bitsets for {}", expr
                );

                let got = schedule.next_after(after);
                let first = after.div_euclid(60_000) + 1;
                let mut t = DateTime::from_timestamp(first * 60, 0).unwrap().naive_utc();
                let mut expected = None;
                for i in 0..BRUTE_MINUTES {
                    if brute_matches(&specs, &sets, t) {
                        expected = Some((first + i) * 60_000);
                        break;
                    }
                    t += chrono::TimeDelta::minutes(1);
                }
                match expected {
                    Some(want) => prop_assert_eq!(got, Some(want), "expr {} after {}", expr, after),
                    None => if let Some(g) = got {
                        prop_assert!(g >= (first + BRUTE_MINUTES) * 60_000, "expr {} after {}: {}", expr, after, g);
                    },
                }
                if let Some(g) = got {
                    prop_assert!(g > after);
                    prop_assert_eq!(g % 60_000, 0);
                }
            }

            #[test]
            fn parse_never_panics(s in any::<String>()) {
                let _ = CronSchedule::parse(&s);
            }

            #[test]
            fn parse_never_panics_on_cron_like_text(s in "[0-9A-Za-z*/, ?@#\t-]{0,40}") {
                if let Ok(schedule) = CronSchedule::parse(&s) {
                    prop_assert_eq!(schedule.expr(), s.trim());
                }
            }

            #[test]
            fn next_after_in_matches_brute_force(
                specs in specs(),
                zone in 0..TZ_ZONES.len(),
                after in Y2000_MS..Y2040_MS,
            ) {
                let tz = parse_time_zone(TZ_ZONES[zone]).unwrap();
                check_zone(&specs, tz, after, 3)?;
            }

            #[test]
            fn next_after_in_matches_brute_force_near_transitions(
                specs in daily_specs(),
                zone in 0..DST_ZONES,
                year in 2000..2040i32,
                which in 0..2usize,
                shift_minutes in prop_oneof![-45..=5i64, -240..=60i64],
                sub_minute_ms in 0..60_000i64,
            ) {
                let tz = parse_time_zone(TZ_ZONES[zone]).unwrap();
                let changes = transitions(tz, year);
                let base = if changes.is_empty() {
                    ms(year, 6, 1, 0, 0) // Sao Paulo has had no DST since 2019.
                } else {
                    changes[which % changes.len()]
                };
                let after = base + shift_minutes * 60_000 + sub_minute_ms;
                check_zone(&specs, tz, after, 30)?;
            }

            #[test]
            fn next_after_in_never_panics(
                specs in specs(),
                zone in prop::sample::select(&[
                    "Europe/Berlin",
                    "Australia/Lord_Howe",
                    "Asia/Kathmandu",
                    "Pacific/Kiritimati",
                    "Pacific/Apia",
                    "Etc/GMT+12",
                    "America/Sitka",
                    "Africa/Monrovia",
                    "UTC",
                ][..]),
                after in prop_oneof![any::<i64>(), -5_000_000_000_000i64..5_000_000_000_000],
            ) {
                let expr = specs.iter().map(FieldSpec::render).collect::<Vec<_>>().join(" ");
                let schedule = CronSchedule::parse(&expr).unwrap();
                let tz = parse_time_zone(zone).unwrap();
                let mut t = after;
                for _ in 0..3 {
                    match schedule.next_after_in(t, tz) {
                        Some(g) => {
                            prop_assert!(g > t);
                            t = g;
                        }
                        None => break,
                    }
                }
            }

            #[test]
            fn parse_time_zone_never_panics(s in any::<String>()) {
                let _ = parse_time_zone(&s);
            }

            #[test]
            fn next_after_never_panics(specs in specs(), after in any::<i64>()) {
                let expr = specs.iter().map(FieldSpec::render).collect::<Vec<_>>().join(" ");
                let schedule = CronSchedule::parse(&expr).unwrap();
                if let Some(g) = schedule.next_after(after) {
                    prop_assert!(g > after);
                    prop_assert_eq!(g % 60_000, 0);
                    prop_assert!(g < ms(10000, 1, 1, 0, 0));
                }
            }
        }
    }
}
