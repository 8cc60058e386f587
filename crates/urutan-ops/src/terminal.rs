//! Producer data on an operator's terminal.
//!
//! A message id, a header or a body is chosen by whoever may publish; printed
//! raw, an escape sequence in it is a command to the terminal (OSC 52 writes
//! the clipboard, `ESC [2J` clears the screen, a bidi override reorders what
//! is read). Every human-readable output that shows producer data goes
//! through [`Clean`] (one value on one line) or [`Lines`] (a whole text whose
//! line breaks are urutan's own). JSON outputs need neither: serde escapes
//! control characters, and bidi controls are only text there.

use std::fmt;

/// `s` with every control character escaped: C0 (newline included), DEL,
/// C1 and the bidi controls, as `\xNN` or `\u{NNNN}`. What is left cannot
/// move the cursor, start a sequence, or break a line.
pub struct Clean<'a>(pub &'a str);

/// `s` as [`Clean`] shows it, except that `\n` stays a line break.
pub struct Lines<'a>(pub &'a str);

impl fmt::Display for Clean<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0, false)
    }
}

impl fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0, true)
    }
}

/// `s` as [`Clean`] shows it, as a `String` (e.g. a table cell whose width
/// is measured).
pub fn clean(s: &str) -> String {
    Clean(s).to_string()
}

/// Whether `c` must not reach a terminal as it is.
fn is_unsafe(c: char) -> bool {
    c.is_control() // C0, DEL and C1
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn write_escaped(f: &mut fmt::Formatter<'_>, s: &str, keep_newlines: bool) -> fmt::Result {
    let mut rest = s;
    while let Some(at) = rest.find(|c: char| is_unsafe(c) && !(keep_newlines && c == '\n')) {
        f.write_str(&rest[..at])?;
        let c = rest[at..].chars().next().unwrap_or('\0');
        match u32::from(c) {
            n @ 0..=0xff => write!(f, "\\x{n:02x}")?,
            n => write!(f, "\\u{{{n:04x}}}")?,
        }
        rest = &rest[at + c.len_utf8()..];
    }
    f.write_str(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_not_run() {
        let osc52 = "id\x1b]52;c;ZWNobyBo\x07\x1b[2J\r\nfake\u{9b}1m\u{7f}\u{202e}x";
        let clean = Clean(osc52).to_string();
        assert_eq!(
            clean,
            "id\\x1b]52;c;ZWNobyBo\\x07\\x1b[2J\\x0d\\x0afake\\x9b1m\\x7f\\u{202e}x"
        );
        assert!(!clean.chars().any(is_unsafe), "{clean}");
        assert_eq!(Lines("a\nb\x1bc").to_string(), "a\nb\\x1bc");
        assert_eq!(Clean("order é-17 \t").to_string(), "order é-17 \\x09");
    }
}
