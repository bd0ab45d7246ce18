//! Cron expressions (five-field, Vixie-cron style) and next-fire-time calculation, in UTC.
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

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Datelike, NaiveDate, Timelike};
use thiserror::Error;

/// Longest accepted expression, in characters (after trimming surrounding whitespace).
pub const MAX_CRON_EXPR_LEN: usize = 1000;

const MS_PER_MINUTE: i64 = 60_000;
const MAX_YEAR: i32 = 9999;
/// The Gregorian calendar, weekdays included, repeats every 400 years (146097 days, a whole
/// number of weeks), so a schedule that does not fire within 400 years never fires.
const MAX_MONTHS_SCANNED: u32 = 400 * 12 + 1;

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

/// A parsed cron expression: minute hour day-of-month month day-of-week, UTC.
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
    /// Cost: the search jumps field-wise (month, then day, then hour, then minute). It visits
    /// at most `MAX_MONTHS_SCANNED` (~4800, one full 400-year Gregorian cycle) selected
    /// months, doing at most 31 day checks per month; only the first candidate day can fail
    /// at the hour/minute level (at most 24 hour probes, each with an O(1) minute lookup).
    /// So the worst case (an expression that never fires) is O(4800 * 31) cheap steps.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let first_minute = after_ms.div_euclid(MS_PER_MINUTE).checked_add(1)?;
        let start = DateTime::from_timestamp(first_minute.checked_mul(60)?, 0)?.naive_utc();

        let (mut year, mut month) = (start.year(), start.month());
        let (mut day, mut hour, mut minute) = (start.day(), start.hour(), start.minute());
        let first_month = next_set_bit(self.months, 1)?;

        for _ in 0..MAX_MONTHS_SCANNED {
            if year > MAX_YEAR {
                return None;
            }
            if self.months & (1 << month) != 0 {
                if let Some((d, h, m)) = self.first_in_month(year, month, day, hour, minute) {
                    let secs = NaiveDate::from_ymd_opt(year, month, d)?
                        .and_hms_opt(h, m, 0)?
                        .and_utc()
                        .timestamp();
                    return secs.checked_mul(1000);
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
