//! What PostgreSQL's `jsonb` refuses in JSON that is otherwise valid, found
//! in one pass over the text without recursion: `data` is stored as
//! `jsonb` (and handed to the handler function as one), so anything here
//! would fail the apply transaction on every delivery until the queue's
//! delivery limit; it is a contract violation instead. Each rule was
//! checked against PostgreSQL 15 (`SELECT $1::jsonb`, see the integration
//! test `hostile::jsonb_refusals_match_postgresql`).

use super::{MAX_DEPTH, Rejection};

/// Decimal exponent of the leading digit of the largest `numeric`:
/// 131,072 digits before the decimal point.
const NUMERIC_MAX_WEIGHT: i64 = 131_071;
/// Most digits after the decimal point of a `numeric`.
const NUMERIC_MAX_SCALE: i64 = 16_383;
/// Exponents this large (either sign) overflow `numeric` whatever the
/// digits, zero included (`INT_MAX / 2` in PostgreSQL's `numeric.c`).
const NUMERIC_MAX_EXPONENT: i64 = 1_073_741_823;

/// Checks `json` (already known to be valid JSON): the escape `\u0000`
/// ([`Rejection::NulCharacter`]), a lone surrogate escape such as `\ud800`
/// and a number outside `numeric`'s range such as `1e1000000`
/// ([`Rejection::InvalidJson`]), and nesting deeper than [`MAX_DEPTH`]
/// ([`Rejection::TooDeep`]). Raw NUL bytes cannot occur: JSON forbids
/// control characters in strings.
pub(super) fn check(json: &str) -> Result<(), Rejection> {
    let bytes = json.as_bytes();
    let (mut depth, mut in_string, mut i) = (0usize, false, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if in_string => {
                // Skips the whole escape, so `\\u0000` is plain text.
                i += match bytes.get(i + 1) {
                    Some(b'u') => unicode_escape(bytes, i)?,
                    _ => 2,
                };
                continue;
            }
            b'"' => in_string = !in_string,
            b'[' | b'{' if !in_string => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(Rejection::TooDeep);
                }
            }
            b']' | b'}' if !in_string => depth = depth.saturating_sub(1),
            b'-' | b'0'..=b'9' if !in_string => {
                i += number(&bytes[i..])?;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The `\uXXXX` escape at `i`: its length, the low half of a surrogate
/// pair included. Refuses `\u0000` and a surrogate without its other half.
fn unicode_escape(bytes: &[u8], i: usize) -> Result<usize, Rejection> {
    let unit = |at: usize| {
        let escape = bytes.get(at..at + 6)?.strip_prefix(b"\\u")?;
        u16::from_str_radix(std::str::from_utf8(escape).ok()?, 16).ok()
    };
    match unit(i) {
        Some(0) => Err(Rejection::NulCharacter),
        Some(0xD800..=0xDBFF) => match unit(i + 6) {
            Some(0xDC00..=0xDFFF) => Ok(12),
            _ => Err(Rejection::InvalidJson),
        },
        Some(0xDC00..=0xDFFF) | None => Err(Rejection::InvalidJson),
        Some(_) => Ok(6),
    }
}

/// The JSON number at the start of `bytes`: its length. Refuses one that
/// `numeric` (how `jsonb` stores numbers) cannot hold: more than
/// [`NUMERIC_MAX_SCALE`] digits after the point or a leading digit beyond
/// [`NUMERIC_MAX_WEIGHT`], once the exponent is applied.
fn number(bytes: &[u8]) -> Result<usize, Rejection> {
    let digits = |from: usize| {
        let rest = bytes.get(from..).unwrap_or_default();
        rest.iter().take_while(|b| b.is_ascii_digit()).count()
    };
    let mut end = usize::from(bytes[0] == b'-');
    let int = &bytes[end..end + digits(end)];
    end += int.len();
    let mut frac: &[u8] = &[];
    if bytes.get(end) == Some(&b'.') {
        frac = &bytes[end + 1..end + 1 + digits(end + 1)];
        end += 1 + frac.len();
    }
    let mut exponent = 0i64;
    if matches!(bytes.get(end), Some(b'e' | b'E')) {
        end += 1;
        let negative = bytes.get(end) == Some(&b'-');
        end += usize::from(matches!(bytes.get(end), Some(b'+' | b'-')));
        let n = digits(end);
        // Saturates far above the limit instead of overflowing.
        exponent = bytes[end..end + n].iter().fold(0i64, |acc, d| {
            (acc * 10 + i64::from(d - b'0')).min(NUMERIC_MAX_EXPONENT * 10)
        });
        if negative {
            exponent = -exponent;
        }
        end += n;
    }
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let scale = count(frac.len()).saturating_sub(exponent).max(0);
    // Decimal exponent of the leading significant digit (none: zero).
    let leading = match int.iter().position(|d| *d != b'0') {
        Some(p) => Some(count(int.len() - p) - 1),
        None => frac.iter().position(|d| *d != b'0').map(|p| -count(p) - 1),
    };
    let fits = exponent.abs() < NUMERIC_MAX_EXPONENT
        && scale <= NUMERIC_MAX_SCALE
        && leading.is_none_or(|w| w.saturating_add(exponent) <= NUMERIC_MAX_WEIGHT);
    if fits {
        Ok(end)
    } else {
        Err(Rejection::InvalidJson)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(json: &str) -> Result<(), Rejection> {
        check(json)
    }

    #[test]
    fn escapes_postgresql_refuses() {
        for ok in [
            r#""\ud800\udc00""#,
            r#""\uDBFF\uDFFF""#,
            r#""\\ud800""#,
            r#""\"\u00e9""#,
            r#"{"\u0041":1}"#,
        ] {
            assert_eq!(verdict(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            (r#""\ud800""#, Rejection::InvalidJson),
            (r#""\udc00""#, Rejection::InvalidJson),
            (r#""\ud800x""#, Rejection::InvalidJson),
            (r#""\ud800\ud800""#, Rejection::InvalidJson),
            (r#""\ud800\u0041""#, Rejection::InvalidJson),
            (r#"{"\udfff":1}"#, Rejection::InvalidJson),
            (r#"["a","\u0000"]"#, Rejection::NulCharacter),
        ] {
            assert_eq!(verdict(bad), Err(why), "{bad}");
        }
    }

    #[test]
    fn numbers_outside_numeric_are_refused() {
        let ok = [
            "0".to_owned(),
            "-0".to_owned(),
            "1e1000".to_owned(),
            "1E+0001".to_owned(),
            "1e-0".to_owned(),
            "0e1000000".to_owned(),
            "0e1073741822".to_owned(),
            "1e131071".to_owned(),
            "12.5e131070".to_owned(),
            "0.1e131072".to_owned(),
            "0.001e131074".to_owned(),
            "1e-16383".to_owned(),
            "1.5e-16382".to_owned(),
            "0e-16383".to_owned(),
            "0.0e-16382".to_owned(),
            format!("1{}", "0".repeat(131_071)),
            format!("1.{}", "0".repeat(16_383)),
            format!("0.{}1e1", "0".repeat(16_383)),
            "[1.5,-2,{\"a\":3e10}]".to_owned(),
        ];
        for n in &ok {
            assert_eq!(verdict(n), Ok(()), "{}", &n[..n.len().min(40)]);
        }
        let bad = [
            "1e1000000".to_owned(),
            "1e-1000000".to_owned(),
            "1e131072".to_owned(),
            "12.5e131071".to_owned(),
            "0.1e131073".to_owned(),
            "1e-16384".to_owned(),
            "1.5e-16383".to_owned(),
            "-0e-16384".to_owned(),
            "0.0e-99999".to_owned(),
            "0e1073741823".to_owned(),
            "0e-1073741823".to_owned(),
            "0e99999999999999999999999".to_owned(),
            format!("1{}", "0".repeat(131_072)),
            format!("1.{}", "0".repeat(16_384)),
            format!("{{\"a\":[1,{}]}}", "9".repeat(131_073)),
        ];
        for n in &bad {
            assert_eq!(
                verdict(n),
                Err(Rejection::InvalidJson),
                "{}",
                &n[..n.len().min(40)]
            );
        }
    }

    #[test]
    fn numbers_inside_strings_are_text() {
        assert_eq!(verdict(r#""1e1000000""#), Ok(()));
        assert_eq!(verdict(r#"{"1e1000000":"\\"}"#), Ok(()));
    }
}
