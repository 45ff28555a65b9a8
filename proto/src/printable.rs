//! Text from a peer, made safe to show to a person: a target's ERROR text and volume names may
//! hold anything UTF-8 allows, terminal escapes included.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every character that could drive a terminal or hide what is shown escaped, as
/// OpenSSH shows a server's strings (`strnvis` with `VIS_SAFE | VIS_OCTAL`), in Rust's
/// notation: newline, tab and carriage return as `\n`, `\t`, `\r`; other C0 controls and DEL as
/// `\x1b`, `\x7f`; C1 controls and the bidirectional formatting characters (which reorder what
/// a terminal shows) as `\u{9b}`, `\u{202e}`. Everything else, backslashes included, is left as
/// it is; text with nothing to escape is borrowed.
///
/// ```
/// assert_eq!(rblk_proto::printable("\x1b]0;pwned\x07 volume"), r"\x1b]0;pwned\x07 volume");
/// assert!(matches!(rblk_proto::printable("no such volume db"), std::borrow::Cow::Borrowed(_)));
/// ```
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        // Writing into a String cannot fail.
        let _ = match c {
            '\n' => out.write_str(r"\n"),
            '\t' => out.write_str(r"\t"),
            '\r' => out.write_str(r"\r"),
            c if escaped(c) && c.is_ascii() => write!(out, "\\x{:02x}", u32::from(c)),
            c if escaped(c) => write!(out, "\\u{{{:x}}}", u32::from(c)),
            c => out.write_char(c),
        };
    }
    Cow::Owned(out)
}

/// C0 and C1 controls, DEL, and the bidirectional formatting characters.
fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a control character that reaches a terminal raw (an escape that retitles the
    /// window or moves the cursor, a C1 CSI, text reordered by a bidi override), or printable
    /// text changed.
    #[test]
    fn controls_are_escaped_and_nothing_else() {
        assert_eq!(printable("\x1b]0;pwned\x07"), r"\x1b]0;pwned\x07");
        assert_eq!(printable("a\nb\tc\rd\0e\x7f"), r"a\nb\tc\rd\x00e\x7f");
        assert_eq!(printable("\u{9b}31m"), r"\u{9b}31m");
        assert_eq!(printable("abc\u{202e}fed"), r"abc\u{202e}fed");
        for text in ["volume db: no such volume", r"C:\path", "größe 4 GiB", "日本語", ""] {
            assert!(matches!(printable(text), Cow::Borrowed(t) if t == text), "{text:?}");
        }
        let all: String = (0..=0x2100).filter_map(char::from_u32).collect();
        let shown = printable(&all);
        assert!(!shown.chars().any(escaped), "{shown:?}");
    }
}
